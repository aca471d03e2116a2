"""Re-plan with prices learned from the binding resources of the plan before.

Source: specification, "Global placement loop": placement computes each model's
future-compatible host set and penalises a flexible model on a host a more constrained one
needs. The per-class scarcity price (:meth:`grid_core.planner.core.PlanState.scarcity`) is a
one-step estimate made before anything is placed; on oversubscribed fleets it cannot see
that a slot-limited GPU host ends with every model slot taken and tens of GB unused, while
the Macs that could have held the small models run out of memory. Once a plan exists, those
facts are known, so the planner prices them and plans once more:

* a host that ended **slot-bound** (every model slot taken) while some short model could use
  it charges one expected lost placement for taking a slot;
* a host that ended **memory-bound** (too little memory left for any short model that could
  use it) charges, per MB, one lost placement per mean footprint of those short models
  (weighted by how many replicas each still misses), so a 43 GB replica there costs about
  five 8 GB ones and a 5 GB replica less than one.

A small model then prefers a memory-bound host (it costs less than a whole slot) and a large
one prefers a slot-bound host, which is how an optimal packing of these fleets looks. The new
plan replaces the old one only when it places more replicas in some priority class without
placing fewer in any class above it (compared from the highest class down) and stages no
more evictions or relocations. Both plans obey every hard rule and the same orders (pins
first, classes high to low, fair rounds, live incumbents kept first), so the choice only
picks the better packing of valid plans. Prices are learned again from each accepted plan,
at most :data:`MAX_REPLANS` times; the first re-plan that does not improve ends the loop, so
a fleet where re-planning cannot help pays for one extra plan only.

**Size-priced candidate.** What the finished plans still miss on slot-bound fleets is
mostly the lowest class, and the pattern is structural: large replicas fill the memory of
hosts without a model-slot ceiling (large Macs), while servers with few slots are full of
small replicas and keep memory nobody can use. So once the kept plan has had its exchange
repair, one more candidate is planned with held room (:mod:`grid_core.planner.holds`) and a
*size price* (:func:`size_prices`): on a host without a ceiling, a new replica larger than
the mean footprint of the models still short pays for the difference. The candidate is
kept only when it places more in all and no fewer in any priority class (:func:`dominates`),
so no class ever loses to it; it is abandoned as soon as a finished class is behind.
"""

from __future__ import annotations

from grid_core.planner.core import PlanState

MAX_REPLANS = 1
"""Extra plans at most. Measured with the proportional admission headroom on the 64x32
bench fleets at occupancy 0, seeds 1-27: one re-plan places 4,500 replicas in all, a second
4,499 (the first gains everything there is to gain: 4,460 without any) for a fifth more
planning CPU; a plan that leaves demand unmet therefore costs about two plans, not three."""


SIZE_PRICE_WEIGHT = 1.0
"""Expected lost placements a new replica pays on a host without a model-slot ceiling per
mean short-model footprint it is larger than that mean (capped with the learned prices at
:data:`grid_core.planner.core.LEARNED_PRICE_CAP`). Measured on the 64x32 bench fleets at
occupancy 0, seeds 1-50 (held room, :data:`SIZE_CANDIDATE_REPAIR_STEPS`): weights 0.5 / 1 /
2 / 3 place 8,542 / 8,544 / 8,546 / 8,542 replicas against 8,528 without the candidate, and
leave 9 / 7 / 8 / 9 seeds more than 0.02 below the exact optimum (13 without); no class
places fewer on any seed with any of them."""


LOWER_CLASS_SLOT_FIT_WEIGHT = 60.0
"""Slot-fit weight of the lower-class-aware candidate (twice
:data:`grid_core.planner.core.SLOT_FIT_WEIGHT`): with the lower-class prices it keeps the
large multi-slot servers' slots for replicas that use their memory. Measured on the 64x32
bench fleets at occupancy 0 (exact ordered optima 8,638 for seeds 1-50 and 4,920 for
51-80; 8,562 and 4,861 without the candidate): the candidate with the class prices and
weight 30 places 8,565 / 4,862, 45: 8,568 / 4,863, 60: 8,570 / 4,865, 100: 8,566 / 4,866
(weight 60 without the class prices: 8,562 / 4,865). Held-out seeds 81-110: 5,042 -> 5,046."""


SIZE_CANDIDATE_REPAIR_STEPS = 50
"""One-move repair steps the size-priced candidate plan may spend (it makes no ejection
chains): a full plan's repair and chains cost about 4 of its 12 ms on 64x32 seed 2 at
occupancy 0. Measured on the 64x32 bench fleets at occupancy 0, seeds 1-50: full budgets
place 8,549 replicas, 50 steps and no chains 8,544, no repair at all 8,535 (8,528 without
the candidate), while the candidate's CPU falls from about 12.6 to 7.5 ms."""


def learned_prices(state: PlanState, below: int | None = None) -> list[tuple[float, float]] | None:
    """Per host ``(price of one model slot, price per MB)`` in expected lost placements,
    from the ended plan ``state``; ``None`` when no model with a candidate host is short.

    Only hosts where some short model could still go (a candidate host not already holding
    it) are priced; a host with room left for the smallest of them is not bound and costs
    nothing. With ``below``, only short models of a priority lower than ``below`` count
    (:func:`lower_class_prices`).
    """
    ledger = state.ledger
    count = ledger.count
    demand: dict[int, list[float]] = {}
    """Host → [sum of missing x MB, sum of missing, smallest MB] over short models."""
    any_short = False
    for mi, hosts in enumerate(state.cands):
        missing = state.needed(mi) - count[mi]
        if missing <= 0 or not hosts:
            continue
        if below is not None and state.profiles[mi].priority >= below:
            continue
        any_short = True
        mid = state.profiles[mi].model_id
        mems = state.mem_rows[mi]
        for hi in hosts:
            if mid in ledger.books[hi].present:
                continue
            acc = demand.get(hi)
            if acc is None:
                acc = demand[hi] = [0.0, 0.0, float(mems[hi])]
            acc[0] += missing * mems[hi]
            acc[1] += missing
            acc[2] = min(acc[2], mems[hi])
    if not any_short:
        return None
    prices: list[tuple[float, float]] = []
    for hi, book in enumerate(ledger.books):
        acc = demand.get(hi)
        if acc is None or not book.eligible:
            prices.append((0.0, 0.0))
            continue
        slot_bound = bool(book.max_models) and len(book.present) >= book.max_models
        memory_bound = min(book.inc_free, book.raw_free) < acc[2]
        mean_mb = acc[0] / acc[1]
        prices.append((1.0 if slot_bound else 0.0, 1.0 / mean_mb if memory_bound else 0.0))
    return prices


def lower_class_prices(state: PlanState) -> dict[int, list[tuple[float, float]] | None]:
    """Learned prices per priority class for the lower-class-aware candidate, from the
    ended plan ``state``: a class's replicas pay (:func:`learned_prices`) only for the
    hosts the models still short in the classes *below* it need, so the short models
    themselves, and classes with nothing short below them, pay nothing (``None``)."""
    return {c: learned_prices(state, c) for c in sorted({p.priority for p in state.profiles})}


def size_prices(state: PlanState) -> tuple[list[float], float] | None:
    """Per host MB price above a floor for the size-priced candidate plan, from the ended
    plan ``state``: ``(slopes, floor_mb)``, or ``None`` when no model with a candidate host
    is short.

    ``floor_mb`` is the mean footprint of the models still short (each weighted by the
    replicas it misses, its footprint averaged over its candidate hosts). On a host without
    a model-slot ceiling a new replica pays :data:`SIZE_PRICE_WEIGHT` expected lost
    placements per ``floor_mb`` it is larger than that (``slopes[host]`` per MB); hosts
    with a ceiling, and ineligible ones, pay nothing (slope 0).
    """
    num = den = 0.0
    for mi, hosts in enumerate(state.cands):
        missing = state.needed(mi) - state.ledger.count[mi]
        if missing <= 0 or not hosts:
            continue
        mems = state.mem_rows[mi]
        num += missing * sum(mems[hi] for hi in hosts) / len(hosts)
        den += missing
    if not den:
        return None
    floor = num / den
    slope = SIZE_PRICE_WEIGHT / floor
    slopes = [slope if b.eligible and not b.max_models else 0.0 for b in state.ledger.books]
    return slopes, floor


def dominates(alt: PlanState, base: PlanState) -> bool:
    """Whether plan ``alt`` places at least as many as ``base`` in every priority class and
    more in all, and stages no more evictions or relocations."""
    if len(alt.evictions) > len(base.evictions) or len(alt.relocations) > len(base.relocations):
        return False
    a, b = class_counts(alt), class_counts(base)
    return all(x >= y for x, y in zip(a, b, strict=True)) and sum(a) > sum(b)


def improves(alt: PlanState, base: PlanState) -> bool:
    """Whether plan ``alt`` places more than ``base`` in the highest priority class where
    they differ, and stages no more evictions or relocations."""
    if len(alt.evictions) > len(base.evictions) or len(alt.relocations) > len(base.relocations):
        return False
    return class_counts(alt) > class_counts(base)


def behind(alt: PlanState, base: PlanState, done: int) -> bool:
    """Whether re-plan ``alt``, whose classes down to priority ``done`` have placed, already
    has fewer replicas than the finished plan ``base`` in the highest class where the two
    differ (so it cannot improve on ``base``: the planner abandons it there).

    Once a class's rounds are over, lower classes never add to its count (their repair
    moves its new replicas but never drops or adds one; their preemptions take only
    lower-priority or surplus work). Only the last repair pass over every model could
    still add to it, so this is a cut, not a proof; on the 64x32 and 256x64 bench fleets
    (64x32 seeds 1-50 at occupancy 0, seeds 1-2 at 0.5; 256x64 seeds 1-2 at 0 and 0.5)
    abandoning there changed no plan and saved up to a third of a re-plan. Never behind
    in the lowest class when ``alt.finish_lowest`` is set.
    """
    classes = sorted({p.priority for p in base.profiles}, reverse=True)
    if alt.finish_lowest and done == classes[-1]:
        return False  # its exchanges and settling may still catch up (PlanState.finish_lowest)
    cut = classes.index(done) + 1
    mine = class_counts(alt)[:cut]
    if alt.dominate is not None:  # kept only if no class is behind (:func:`dominates`)
        return any(x < y for x, y in zip(mine, alt.dominate[:cut], strict=True))
    return mine < class_counts(base)[:cut]


def class_counts(state: PlanState) -> list[int]:
    """Replicas placed per priority class, highest class first."""
    classes = sorted({p.priority for p in state.profiles}, reverse=True)
    by_class = {c: i for i, c in enumerate(classes)}
    out = [0] * len(classes)
    for mi, p in enumerate(state.profiles):
        out[by_class[p.priority]] += state.ledger.count[mi]
    return out
