"""Bounded backtracking repair when greedy placement fragments capacity.

Source: specification, "Global placement loop": a deterministic bounded repair may evacuate
and re-place equal-priority replicas; on homogeneous empty-residency fleets aggregate free
memory and model slots are an admissible lower bound, so a saturated fleet fails fast.
"""

from __future__ import annotations

from grid_core.planner.chains import chain_rounds
from grid_core.planner.core import PlanState
from grid_core.planner.holds import FIXED_REASONS
from grid_core.planner.ledger import Placed

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
    """Try to place each short model of ``models`` by relocating new replicas.

    Any new (not yet live) replica may move, whatever its priority, as long as it lands on
    another host: repair never drops a placed replica and never touches live work, so it
    only ever adds coverage. A move may chain once (the moved replica itself displaces a
    second one) within the per-plan step budget.
    """
    _one_move_repairs(state, models, homogeneous)
    chain_rounds(state, models)


def _one_move_repairs(state: PlanState, models: list[int], homogeneous: bool) -> None:
    everyone = list(range(len(state.profiles)))
    for mi in models:
        if not state.cands[mi]:
            continue
        while state.ledger.count[mi] < state.needed(mi):
            if state.repair_steps >= state.policy.repair_budget:
                return
            if homogeneous and not lower_bound_allows(state, mi, everyone):
                break
            if not _repair_one(state, mi):
                break


def _movable(state: PlanState, hi: int, mi: int, need: int, avoid: set[int]) -> list[Placed]:
    """New replicas on ``hi`` whose departure could make room for ``mi`` (at least ``need``
    MB; none of ``avoid``), largest first."""
    book = state.ledger.books[hi]
    got = state.shift_memo.get(hi)
    if got is None or got[0] != book.version:  # the list changes only with the host
        shiftable = [
            pl for pl in book.models.values() if not pl.incumbent and pl.reason not in FIXED_REASONS
        ]
        shiftable.sort(key=_largest_first)
        got = state.shift_memo[hi] = (book.version, shiftable)
    out = []
    for pl in got[1]:
        if pl.memory_mb < need:
            break  # the rest are smaller still
        if pl.mi != mi and pl.mi not in avoid:
            out.append(pl)
    return out


def _largest_first(pl: Placed) -> tuple[int, int]:
    """Sort key of :func:`_movable`: larger replicas first, then model index."""
    return (-pl.memory_mb, pl.mi)


def _direct_fit(state: PlanState, xi: int, skip: int, seen: dict[int, list[int]]) -> bool:
    """Cheap test (no scoring): could ``xi`` fit some candidate host other than ``skip``?

    ``seen`` remembers, per model, the first two hosts where it fits directly, for as long
    as the ledger stands as it did when they were found (one :func:`_make_room` search:
    every trial there is undone before the next)."""
    fits = seen.get(xi)
    if fits is None:
        fits = seen[xi] = _direct_hosts(state, xi)
    return any(hi != skip for hi in fits)


def _direct_hosts(state: PlanState, xi: int) -> list[int]:
    """The first two candidate hosts (by index) where ``xi`` fits directly (quick check)."""
    books = state.ledger.books
    mid = state.profiles[xi].model_id
    mems = state.mem_rows[xi]
    out: list[int] = []
    for hi in state.cands[xi]:
        b = books[hi]
        if (
            b.eligible
            and not b.blocked
            and b.inc_free >= mems[hi]
            and b.raw_free >= mems[hi]
            and not (b.max_models and len(b.present) >= b.max_models)
            and mid not in b.present
        ):
            out.append(hi)
            if len(out) == 2:
                break
    return out


def _repair_one(state: PlanState, mi: int) -> bool:
    """Place one more replica of ``mi`` by moving one new replica (chained at most once)."""
    return _make_room(state, mi, set(), depth=1)


def _rehome(state: PlanState, xi: int, avoid: set[int], depth: int) -> bool:
    """Give displaced replica ``xi`` a new host, moving one more replica when ``depth``."""
    found = state.best_host(xi)
    if found is not None:
        state.ledger.place(xi, found[0], "repair", found[1])
        return True
    return depth > 0 and _make_room(state, xi, avoid, depth - 1)


def _make_room(state: PlanState, mi: int, avoid: set[int], depth: int) -> bool:
    """Place ``mi`` on a candidate host by moving one new replica off it to another host.

    A replica that fits nowhere else directly is only tried when ``depth`` allows a second
    move; every trial counts against the per-plan budget.
    """
    ledger = state.ledger
    books = ledger.books
    mems = state.mem_rows[mi]
    seen: dict[int, list[int]] = {}
    keep = avoid | {mi}  # replicas this search may not move
    for hi in state.cands[mi]:
        book = books[hi]
        inc, raw = book.inc_free, book.raw_free
        movable = _movable(state, hi, mi, mems[hi] - (raw if raw < inc else inc), keep)
        if not movable or state.fit_reason(mi, hi) not in REPAIRABLE:
            continue  # (the cheap test first: most hosts have nothing to move)
        for pl in movable:
            state.repair_steps += 1  # a rejected trial costs a step too: the budget is time
            if state.repair_steps > state.policy.repair_budget:
                return False
            if depth <= 0 and not _direct_fit(state, pl.mi, hi, seen):
                continue
            ledger.remove(pl.mi, hi)
            if ledger.fit_new(mi, hi) is None:
                mine = ledger.place(mi, hi, "repair", state.score(mi, hi, True))
                if _rehome(state, pl.mi, avoid | {mi, pl.mi}, depth):
                    return True
                ledger.remove(mine.mi, hi)
            ledger.place(pl.mi, hi, pl.reason, pl.score)
    return False
