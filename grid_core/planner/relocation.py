"""Staged relocation: move an equal-priority incumbent so a blocked model can have its host.

Source: specification, "Global placement loop": a demanded model's sole feasible host is a
hard override; the incumbent is assigned to a replacement host, the replacement is proven
ready, the old copy drains and unloads (make-before-break, done by reconciliation), and only
then does the demanded model start on the released host. Lower-priority blockers are handled
by staged preemption instead; this path never evicts anything.
"""

from __future__ import annotations

from grid_core.planner.core import PlanState
from grid_core.planner.ledger import Placed

MAX_RELOCATIONS = 8
"""Relocations staged per plan: enough to unblock a few constrained models per tick without
turning one plan into a fleet-wide reshuffle."""


def relocate_for(state: PlanState, models: list[int]) -> None:
    """For each model below its baseline (or without any replica) that has placement
    authority and that no host can take, stage at most one relocation of an equal-priority
    incumbent from one of its candidate hosts."""
    from grid_core.planner.phases import may_preempt

    for mi in models:
        if len(state.relocations) >= MAX_RELOCATIONS:
            return
        floor = max(state.profiles[mi].min_replicas, 1)
        if state.ledger.count[mi] >= min(state.desired[mi], floor) or not may_preempt(state, mi):
            continue  # relocation only restores a baseline or a first replica, never scale-out
        for hi in state.cands[mi]:
            if mi not in state.ledger.books[hi].models and _relocate_one(state, mi, hi):
                break


def _fits_without(state: PlanState, mi: int, hi: int, x: Placed) -> bool:
    """Would one replica of ``mi`` fit ``hi`` once incumbent ``x`` has left it?"""
    ledger = state.ledger
    book = ledger.books[hi]
    x_id = state.profiles[x.mi].model_id
    res = state.res_maps[hi].get(x_id)
    live_mb = res.memory_mb if res is not None else x.memory_mb
    _, mem = ledger.memory(mi, hi)
    if book.inc_free + live_mb < ledger.admit_mb(mi, hi) or book.raw_free + x.raw_mb < mem:
        return False
    peers = book.present - {x_id}
    if book.max_models and len(peers) + 1 > book.max_models:
        return False
    if ledger.colocation_conflict(state.profiles[mi].model_id, peers):
        return False
    disk = ledger.disk_cost(mi, hi)
    return not (disk and book.disk_free is not None and book.disk_free < disk)


def _relocate_one(state: PlanState, mi: int, hi: int) -> bool:
    ledger = state.ledger
    book = ledger.books[hi]
    p = state.profiles[mi]
    if book.blocked or not book.eligible or p.model_id in book.present:
        return False
    sole = len(state.cands[mi]) == 1
    movable = []
    for x in book.models.values():
        q = state.profiles[x.mi]
        res = state.res_maps[hi].get(q.model_id)
        if (
            not x.incumbent
            or x.mi == mi
            or q.priority != p.priority
            or res is None
            or not res.actuatable
            or state.hosts[hi].host_id in q.pins
        ):
            continue
        if not sole and state.protected(x.mi, res.loaded_at, res.state):
            continue  # sticky for its minimum residency unless this host is the only option
        if _fits_without(state, mi, hi, x):
            movable.append(x)
    for x in sorted(movable, key=lambda x: (x.memory_mb, x.mi)):
        res = state.res_maps[hi][state.profiles[x.mi].model_id]
        ledger.remove(x.mi, hi)
        dest = _existing_copy(state, x.mi, hi)
        if dest is None:
            found = state.best_host(x.mi)
            if found is not None:
                ledger.place(x.mi, found[0], "relocation", found[1])
                dest = found[0]
        if dest is not None:
            book.blocked = True  # the released memory is for ``mi``, once proven free
            book.version += 1
            state.relocations[mi] = (
                state.profiles[x.mi].model_id,
                state.hosts[hi].host_id,
                state.hosts[dest].host_id,
            )
            return True
        ledger.keep(x.mi, hi, res, x.reason)
    return False


def _existing_copy(state: PlanState, xi: int, source: int) -> int | None:
    """Keep a live, unplanned copy of ``xi`` elsewhere (an earlier relocation in progress)
    instead of starting another one; returns its host."""
    from grid_core.planner.core import serving_incumbents

    ledger = state.ledger
    for hi, res in serving_incumbents(state, xi):
        if (
            hi != source
            and xi not in ledger.books[hi].models
            and ledger.fit_incumbent(xi, hi, res) is None
        ):
            ledger.keep(xi, hi, res, "incumbent")
            return hi
    return None
