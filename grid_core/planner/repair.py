"""Bounded backtracking repair when greedy placement fragments capacity.

Source: specification, "Global placement loop": a deterministic bounded repair may evacuate
and re-place equal-priority replicas; on homogeneous empty-residency fleets aggregate free
memory and model slots are an admissible lower bound, so a saturated fleet fails fast.
"""

from __future__ import annotations

from grid_core.planner.core import PlanState

REPAIRABLE = frozenset({"memory", "slots"})
"""Fit failures a relocation can cure (presence, blocking, colocation and disk cannot)."""


def homogeneous_empty(state: PlanState) -> bool:
    """All eligible hosts interchangeable and empty, no runtime-specific or colocation rules:
    relocation then provably preserves aggregate resource use."""
    eligible = [hi for hi, b in enumerate(state.ledger.books) if b.eligible]
    if not eligible:
        return True
    first = state.hosts[eligible[0]]
    shape = (
        first.capacity_mb,
        first.reserved_mb,
        first.max_models,
        first.throttle_fraction,
        first.state,
        first.external_used_mb,
    )
    from grid_core.planner.eligibility import host_signature

    sig = host_signature(first)
    for hi in eligible:
        h = state.hosts[hi]
        if (
            h.residencies
            or (
                h.capacity_mb,
                h.reserved_mb,
                h.max_models,
                h.throttle_fraction,
                h.state,
                h.external_used_mb,
            )
            != shape
            or host_signature(h) != sig
        ):
            return False
    return not any(
        p.runtime_memory_mb or p.max_colocated_models or p.colocation_excludes
        for p in state.profiles
    )


def lower_bound_allows(state: PlanState, mi: int, peers: list[int]) -> bool:
    """Admissible bound on a homogeneous empty fleet: could any relocation make room?

    Moves between interchangeable hosts preserve aggregate use, so a replica can only be
    found room for when aggregate free memory covers it, a model slot is free somewhere, and
    at least one movable peer replica fits into some other host's free memory.
    """
    books = [b for b in state.ledger.books if b.eligible and not b.blocked]
    frees = [max(0, min(b.inc_free, b.raw_free)) for b in books]
    if sum(frees) < state.ledger.memory(mi, state.cands[mi][0])[1]:
        return False
    if not any(not b.max_models or len(b.present) < b.max_models for b in books):
        return False
    peer_set = set(peers)
    smallest = min(
        (
            pl.memory_mb
            for b in books
            for pl in b.models.values()
            if not pl.incumbent and pl.mi in peer_set and pl.mi != mi
        ),
        default=None,
    )
    return smallest is not None and smallest <= max(frees, default=0)


def repair_class(state: PlanState, models: list[int], homogeneous: bool) -> None:
    """Try to place each short model of one class by relocating equal-priority replicas."""
    for mi in models:
        if state.profiles[mi].pins or not state.cands[mi]:
            continue
        while state.ledger.count[mi] < state.desired[mi]:
            if state.repair_steps >= state.policy.repair_budget:
                return
            if homogeneous and not lower_bound_allows(state, mi, models):
                break
            if not _repair_one(state, mi, models):
                break


def _repair_one(state: PlanState, mi: int, peers: list[int]) -> bool:
    ledger = state.ledger
    peer_set = set(peers)
    # Exact pruning: a move only helps when it frees enough memory on the host and the moved
    # replica fits somewhere else; both are cheap to rule out before trying.
    most_free = max(
        (min(b.inc_free, b.raw_free) for b in ledger.books if b.eligible and not b.blocked),
        default=0,
    )
    for hi in state.cands[mi]:
        if ledger.fit_new(mi, hi) not in REPAIRABLE:
            continue
        book = ledger.books[hi]
        need = state.mem_rows[mi][hi] - min(book.inc_free, book.raw_free)
        movable = [
            pl
            for pl in book.models.values()
            if not pl.incumbent
            and pl.mi != mi
            and pl.mi in peer_set
            and not state.profiles[pl.mi].pins
            and pl.memory_mb >= need
            and min(state.mem_rows[pl.mi].values()) <= most_free
        ]
        for pl in sorted(movable, key=lambda pl: (-pl.memory_mb, pl.mi)):
            state.repair_steps += 1
            if state.repair_steps > state.policy.repair_budget:
                return False
            ledger.remove(pl.mi, hi)
            if ledger.fit_new(mi, hi) is None:
                mine = ledger.place(mi, hi, "repair", state.score(mi, hi, True))
                found = state.best_host(pl.mi)
                if found is not None:
                    ledger.place(pl.mi, found[0], "repair", found[1])
                    return True
                ledger.remove(mine.mi, hi)
            ledger.place(pl.mi, hi, pl.reason, pl.score)
    return False
