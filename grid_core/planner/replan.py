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
"""

from __future__ import annotations

from grid_core.planner.core import PlanState

MAX_REPLANS = 1
"""Extra plans at most. Measured with the proportional admission headroom on the 64x32
bench fleets at occupancy 0, seeds 1-27: one re-plan places 4,500 replicas in all, a second
4,499 (the first gains everything there is to gain: 4,460 without any) for a fifth more
planning CPU; a plan that leaves demand unmet therefore costs about two plans, not three."""


def learned_prices(state: PlanState) -> list[tuple[float, float]] | None:
    """Per host ``(price of one model slot, price per MB)`` in expected lost placements,
    from the ended plan ``state``; ``None`` when no model with a candidate host is short.

    Only hosts where some short model could still go (a candidate host not already holding
    it) are priced; a host with room left for the smallest of them is not bound and costs
    nothing.
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
    abandoning there changed no plan and saved up to a third of a re-plan.
    """
    classes = sorted({p.priority for p in base.profiles}, reverse=True)
    cut = classes.index(done) + 1
    return class_counts(alt)[:cut] < class_counts(base)[:cut]


def class_counts(state: PlanState) -> list[int]:
    """Replicas placed per priority class, highest class first."""
    classes = sorted({p.priority for p in state.profiles}, reverse=True)
    by_class = {c: i for i, c in enumerate(classes)}
    out = [0] * len(classes)
    for mi, p in enumerate(state.profiles):
        out[by_class[p.priority]] += state.ledger.count[mi]
    return out
