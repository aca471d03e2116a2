"""Staged relocation: move an equal-priority incumbent so a blocked model can have its host.

Source: specification, "Global placement loop": a demanded model's sole feasible host is a
hard override; the incumbent is assigned to a replacement host, the replacement is proven
ready, the old copy drains and unloads (make-before-break, done by reconciliation), and only
then does the demanded model start on the released host. Lower-priority blockers are handled
by staged preemption instead; this path never evicts anything.
"""

from __future__ import annotations

import msgspec

from grid_core.planner.core import PlanState
from grid_core.planner.ledger import Placed
from grid_core.planner.types import UnmetResource

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


RELOCATION_FREES: dict[str | None, UnmetResource] = {
    "memory": "memory",
    "slots": "slots",
    "colocation": "colocation",
}
"""What a relocation from a host can free for a blocked model, by the ledger's reason it does
not fit there now; disk is not one (moving an incumbent frees none)."""


def _blocked_by(state: PlanState, mi: int, hi: int) -> UnmetResource:
    """The resource a relocation from ``hi`` frees for ``mi``: the ledger's first reason a
    replica does not fit there while the incumbents stay
    (:meth:`~grid_core.planner.ledger.Ledger.fit_new`: memory before slots before
    colocation), ``memory`` when that is none of these."""
    return RELOCATION_FREES.get(state.ledger.fit_new(mi, hi), "memory")


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
    binds = _blocked_by(state, mi, hi) if movable else "memory"
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
            state.relocation_binds[mi] = binds
            return True
        ledger.keep(x.mi, hi, res, x.reason)
    return False


def mark_make_before_break(state: PlanState) -> None:
    """Mark evictions that take a required model's last ready replica while that model can
    be relocated: the same plan gives it a replacement elsewhere (a new replica now, or a
    staged preemption of lower-priority work), or lower-priority work it may displace holds
    a compatible host only until its minimum residency ends.

    Specification, "Safety invariants" 5 (the last required replica is not drained before its
    replacement is ready) read with 3 (a higher-priority preemption drains its victim first)
    and the placement loop (minimum-residency-protected work is never bypassed; the path
    that preserves the victim's required ready-replica floor is chosen): the victim keeps
    serving until its replacement is ready, and the beneficiary starts a few transitions
    later, or, once that protection ends, takes the lower-priority host instead. Only when
    the victim could never be relocated (no compatible host holds anything of lower priority)
    does the preemption exception stand, so a critical burst is never blocked for good; that
    eviction stays unmarked.
    """
    if not state.evictions:
        return
    ledger = state.ledger
    where = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    out = []
    for e in state.evictions:
        vmi = ledger.index.get(e.model_id)
        if vmi is None or e.make_before_break or state.profiles[vmi].min_replicas < 1:
            out.append(e)
            continue
        victim = state.res_maps[where[e.host_id]].get(e.model_id)
        others = any(
            (e.model_id, state.hosts[hj].host_id) not in state.evicted
            and book.eligible
            and (r := state.res_maps[hj].get(e.model_id)) is not None
            and r.state == "ready"
            for hj, book in enumerate(ledger.books)
        )
        replaced = state.staged.get(vmi, 0) > 0 or any(
            not p.incumbent for p in ledger.placements() if p.mi == vmi
        )
        last = victim is not None and victim.state == "ready" and not others
        hold = last and (replaced or _relocatable_later(state, vmi, where[e.host_id]))
        out.append(msgspec.structs.replace(e, make_before_break=True) if hold else e)
    state.evictions[:] = out


def _relocatable_later(state: PlanState, vmi: int, skip: int) -> bool:
    """Whether a compatible host other than ``skip`` holds lower-priority managed work that
    only its minimum residency protects from ``vmi`` right now."""
    prio = state.profiles[vmi].priority
    index = state.ledger.index
    for hj in state.cands[vmi]:
        if hj == skip or not state.ledger.books[hj].eligible:
            continue
        for r in state.hosts[hj].residencies:
            q = index.get(r.model_id)
            if (
                q is not None
                and r.actuatable
                and state.profiles[q].priority < prio
                and state.protected(q, r.loaded_at, r.state)
            ):
                return True
    return False


def _existing_copy(state: PlanState, xi: int, source: int) -> int | None:
    """Keep a live, unplanned copy of ``xi`` elsewhere (an earlier relocation in progress)
    instead of starting another one; returns its host. A copy this plan already stages for
    eviction is not one: keeping it would both keep and drain the same replica."""
    from grid_core.planner.core import serving_incumbents

    ledger = state.ledger
    model_id = state.profiles[xi].model_id
    for hi, res in serving_incumbents(state, xi):
        if (
            hi != source
            and (model_id, state.hosts[hi].host_id) not in state.evicted
            and xi not in ledger.books[hi].models
            and ledger.fit_incumbent(xi, hi, res) is None
        ):
            ledger.keep(xi, hi, res, "incumbent")
            return hi
    return None
