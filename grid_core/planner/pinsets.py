"""Which pins to reserve on a host whose pins do not all fit (part of the pin phase).

:func:`grid_core.planner.phases.place_pins` reserves pins one model at a time, priority
classes high to low and, inside a class, constrained and larger models first. When several
pins compete for one small host that order can reserve one large pin where two smaller ones
would have fitted together. Before that loop runs, :func:`reserve_best_pin_sets` looks at
every host with two or more pins still to reserve and, where a different set of them honours
more pins, reserves that set first; the loop then meets those pins as already held and the
pins left out go the way any pin that does not fit goes today (a staged preemption on that
host if one is allowed, otherwise reported as unavailable).
"""

from __future__ import annotations

from grid_core.planner.core import PlanState

PIN_SET_SEARCH_MAX_PINS = 10
"""Most pins still to reserve on one host for which the set to reserve is searched; a host
with more keeps the pin phase's own order (the search visits at most ``2**(n + 1)`` trial
placements, 2,047 here, a few milliseconds at worst).

Source: issue 17's property test over Hypothesis seeds 1-20 (about 40,000 random fleets),
where every plan beyond the bound was four pins competing for one 16 GB host; operators pin
a handful of models to a machine, and ten keeps the worst case small beside a whole plan
(tens of milliseconds on 64x32 fleets)."""


def reserve_best_pin_sets(state: PlanState, order: list[int]) -> None:
    """Reserve, on each host whose pending pins do not all fit, the set the objective prefers.

    ``order`` is the pinned models in the pin phase's order (classes high to low, then
    constrained and larger first). A pin is pending on a host when the host is one of the
    model's candidates and holds no replica of it yet. Every trial placement is checked by
    :meth:`grid_core.planner.ledger.Ledger.fit_new` (memory with admission headroom, model
    slots, colocation, disk, staged work), so no hard rule is relaxed; runtime, backend and
    tags are already in the candidate lists.

    The preferred set honours the most pins of the highest priority class, then of the next
    class, and so on (the order the exact optimum and the specification's "higher classes
    first" use); among equally good sets, the one the phase's own order reaches first. A host
    where that order already does as well is left untouched, as is one with more than
    :data:`PIN_SET_SEARCH_MAX_PINS` pending pins, so the loop decides there exactly as before.
    The search is deterministic: hosts by index, pins in ``order``.
    """
    books = state.ledger.books
    pending: dict[int, list[int]] = {}
    for mi in order:
        hosts = state.pin_hosts[mi]
        if not hosts:
            continue
        cands = set(state.cands[mi])
        for hi in hosts:
            if hi in cands and mi not in books[hi].models:
                pending.setdefault(hi, []).append(mi)
    for hi in sorted(pending):
        pins = pending[hi]
        if len(pins) < 2 or len(pins) > PIN_SET_SEARCH_MAX_PINS:
            continue
        better = best_pin_set(state, hi, pins)
        for mi in better or ():
            state.ledger.place(mi, hi, "pin", state.score(mi, hi, True))


def best_pin_set(state: PlanState, hi: int, pins: list[int]) -> list[int] | None:
    """The pins of ``pins`` (models, in the pin phase's order) to reserve together on host
    ``hi``, or ``None`` when reserving them one by one in that order honours as many.

    A depth-first search over "reserve this pin or not", reserving first, so the first
    complete set it meets is the one the phase's order reserves and later sets come in
    decreasing preference of that order; a set replaces the best so far only when its count
    per class (high to low, compared in that order) is higher. A branch is cut when even
    reserving every remaining pin could not beat the best. Trial placements are made on the
    ledger and removed again, so it is left exactly as found.
    """
    ledger = state.ledger
    prios = [state.profiles[mi].priority for mi in pins]
    classes = sorted(set(prios), reverse=True)
    slot = [classes.index(p) for p in prios]
    n = len(pins)
    rest = [[0] * len(classes) for _ in range(n + 1)]  # pins of each class from i onward
    for i in range(n - 1, -1, -1):
        rest[i] = rest[i + 1].copy()
        rest[i][slot[i]] += 1
    counts = [0] * len(classes)
    taken: list[int] = []
    found: list[tuple[tuple[int, ...], list[int]]] = []  # (counts, set): the first, then better

    def visit(i: int) -> None:
        if i == n:
            got = tuple(counts)
            if not found or got > found[-1][0]:
                found.append((got, list(taken)))
            return
        if found and tuple(c + r for c, r in zip(counts, rest[i], strict=True)) <= found[-1][0]:
            return  # even every remaining pin would not beat the best set
        mi = pins[i]
        if ledger.fit_new(mi, hi) is None:
            ledger.place(mi, hi, "pin")
            counts[slot[i]] += 1
            taken.append(mi)
            visit(i + 1)
            taken.pop()
            counts[slot[i]] -= 1
            ledger.remove(mi, hi)
        visit(i + 1)

    visit(0)
    return found[-1][1] if len(found) > 1 else None
