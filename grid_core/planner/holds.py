"""Held holes: a re-plan keeps room for the lower-priority demand the plan before left unmet.

Source: specification, "Global placement loop": placement keeps the hosts a more constrained
model needs free of flexible work (the future-compatible host set). The per-class scarcity
price looks one placement ahead; it cannot see that a bulk lower-priority model needing many
distinct hosts with a large hole and a free model slot will end short because the classes
above it left those holes on the wrong hosts. A re-plan knows which models ended short, so
it reserves their holes before any class places:

* after incumbents and pins, every model that ended short in the plan before gets *holds*:
  placeholder replicas (reason :data:`HOLD`) on the hosts its own scoring picks, up to the
  replicas it needs, one per model per round;
* every class then places as usual around the holds; a replica that fits nowhere else takes
  a host held for another model of its own or a lower class (the holds there are dropped);
* in its own class, the held model's fair-round turn takes its best held host first; what
  is still held when the class's rounds end is lifted before repair.

A hold occupies memory, a model slot and disk like a replica, but is not counted as one (the
model's count, failure domains and shortfall are its real replicas), is never assigned, and
repair and ejection chains never move it. The re-plan that uses holds runs only for a plan
that stages no preemption or relocation (a hold must never stand in the way of one), and is
kept only when it places more in the highest priority class where the two plans differ
(:func:`grid_core.planner.replan.improves`), so no class ever loses to a lower one.

Measured on the 64x32 bench fleets at occupancy 0 (seeds 1-35, with the slot-fit price of
:data:`grid_core.planner.core.SLOT_FIT_WEIGHT`): seed 2 places 181 of an optimum of 184
(176 without holds or the slot-fit price), 5,958 replicas in all against 5,918.
"""

from __future__ import annotations

from grid_core.planner.core import PlanState

HOLD = "hold"
"""Ledger reason of a held hole (a placeholder replica of a short model)."""
FIXED_REASONS = frozenset({"pin", HOLD})
"""Ledger reasons repair and ejection chains never move: a pin reservation, a hold."""


def short_models(state: PlanState) -> list[int]:
    """Models of ``state``'s finished plan still short of their needed replicas, below the
    highest priority class (the top class has nothing above it to make room)."""
    if not state.profiles:
        return []
    top = max(p.priority for p in state.profiles)
    return [
        mi
        for mi, p in enumerate(state.profiles)
        if p.priority < top and state.cands[mi] and state.ledger.count[mi] < state.needed(mi)
    ]


def _put(state: PlanState, mi: int, hi: int) -> None:
    """Hold ``hi`` for ``mi``: its resources are taken, its replica count is not."""
    ledger = state.ledger
    ledger.place(mi, hi, HOLD, None)
    ledger.count[mi] -= 1
    _uncount_domain(state, mi, hi)
    state.holds.setdefault(mi, set()).add(hi)


def _drop(state: PlanState, mi: int, hi: int) -> None:
    """Give back the hold of ``mi`` on ``hi`` (the inverse of :func:`_put`)."""
    ledger = state.ledger
    ledger.count[mi] += 1
    dom = ledger.domain_list[hi]
    ledger.domains[mi][dom] = ledger.domains[mi].get(dom, 0) + 1
    ledger.remove(mi, hi)
    state.holds[mi].discard(hi)


def _uncount_domain(state: PlanState, mi: int, hi: int) -> None:
    domains = state.ledger.domains[mi]
    dom = state.ledger.domain_list[hi]
    left = domains[dom] - 1
    if left:
        domains[dom] = left
    else:
        del domains[dom]


def reserve_holds(state: PlanState, models: list[int]) -> None:
    """Hold hosts for ``models`` (given in fair-round order), one per model per round, until
    each has holds for every replica it still needs or fits nowhere more."""
    active = list(models)
    while active:
        still = []
        for mi in active:
            found = state.best_host(mi)
            if found is None:
                continue
            _put(state, mi, found[0])
            if state.ledger.count[mi] + len(state.holds[mi]) < state.needed(mi):
                still.append(mi)
        active = still


def lift_holds(state: PlanState, models: list[int]) -> None:
    """Give back every hold of ``models`` (their class's rounds have ended)."""
    for mi in models:
        for hi in sorted(state.holds.get(mi, ())):
            _drop(state, mi, hi)
        state.holds.pop(mi, None)


def take_hold(state: PlanState, mi: int) -> tuple[int, float] | None:
    """At ``mi``'s own turn: its best-scoring held host (the hold given back, so the replica
    can be placed there), or ``None`` when it holds nothing that still fits."""
    best: tuple[float, int] | None = None
    for hi in sorted(state.holds.get(mi, ())):
        s = _score_without(state, mi, hi, [mi])
        if s is not None and (best is None or s > best[0]):
            best = (s, hi)
    if best is None:
        return None
    _drop(state, mi, best[1])
    return best[1], best[0]


def release_hold(state: PlanState, mi: int) -> tuple[int, float] | None:
    """Drop the holds of other models of ``mi``'s priority or lower on one host so ``mi``
    fits there.

    Returns the chosen ``(host, score)`` (best score, then lowest host index) with the holds
    there already given back, or ``None`` when no host fits even without its holds (ledger
    unchanged).
    """
    prio = state.profiles[mi].priority
    held: dict[int, list[int]] = {}
    for xi in sorted(state.holds):
        if xi != mi and state.profiles[xi].priority <= prio:
            for hi in sorted(state.holds[xi]):
                held.setdefault(hi, []).append(xi)
    best: tuple[float, int] | None = None
    for hi in state.cands[mi]:
        xs = held.get(hi)
        if xs is None:
            continue
        # The holds ``mi`` may release here change only with the host's version.
        version = state.ledger.books[hi].version
        domain_new = state.ledger.domain_list[hi] not in state.ledger.domains[mi]
        got = state.unheld_fit.get((mi, hi))
        if got is not None and got[0] == version and got[1] == domain_new:
            s = got[2]
        else:
            s = _score_without(state, mi, hi, xs)
            state.unheld_fit[(mi, hi)] = (version, domain_new, s)
        if s is not None and (best is None or s > best[0]):
            best = (s, hi)
    if best is None:
        return None
    for xi in held[best[1]]:
        _drop(state, xi, best[1])
    return best[1], best[0]


def _score_without(state: PlanState, mi: int, hi: int, xs: list[int]) -> float | None:
    """Score of a new replica of ``mi`` on ``hi`` as if the holds of ``xs`` there were given
    back, or ``None`` when it would not fit even then; the ledger ends as it was.

    Giving the holds back for real (:func:`_drop`, then :func:`_put`) gives the same answer,
    but the trial runs for most held hosts each time a model fits nowhere else, so it only
    lends the host the scalars fit and score read: the holds' memory and disk, their model
    slots, and the headroom share only they needed. A hold's model was not present on the
    host before the hold (a hold is placed only where its model fits), so its id leaves the
    host's present set with it; the host's failure domains, counts and version are not
    read by :meth:`~grid_core.planner.ledger.Ledger.fit_new` or :meth:`PlanState.score`.
    """
    ledger = state.ledger
    book = ledger.books[hi]
    holds = [book.models[xi] for xi in xs]
    saved = (book.inc_free, book.raw_free, book.disk_free, book.extra_mb)
    book.inc_free += sum(pl.inc_mb for pl in holds)
    book.raw_free += sum(pl.raw_mb for pl in holds)
    if book.disk_free is not None:
        book.disk_free += sum(pl.disk_mb for pl in holds)
    if any(ledger.headroom_extra(xi, hi) >= book.extra_mb for xi in xs):
        book.extra_mb = max(
            (
                ledger.headroom_extra(pl.mi, hi)
                for pl in book.models.values()
                if not pl.incumbent and pl.mi not in xs
            ),
            default=0,
        )
    ids = [state.profiles[xi].model_id for xi in xs]
    book.present.difference_update(ids)
    try:
        if ledger.fit_new(mi, hi) is not None:
            return None
        return state.score_now(mi, hi)
    finally:
        book.present.update(ids)
        book.inc_free, book.raw_free, book.disk_free, book.extra_mb = saved
