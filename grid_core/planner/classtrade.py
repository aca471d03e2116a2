"""Class trade: a new replica gives its place to a short model of its own class so that the
classes below place more.

Source: specification, "Global placement loop" (pins first, priority classes high to low,
max-min fair rounds inside a class, a partial round's tie broken by attributable harm; a
deterministic, bounded repair may re-place new replicas when greedy placement fragments
capacity).

Inside a class the fair rounds take the constrained and larger models first, so when a
round cannot serve every model the large one keeps its replica and a small one of the same
class goes without. For that class the two outcomes are equal (one replica each way), but
the large replica may hold room that the small one would leave to other short models of the
class or to the classes below. A random two-host fleet (docs/planner.md) shows it: a 40 GB
priority-1 replica fills the unlimited host, the 5 GB priority-1 model goes unserved and
two priority-0 models find no room; the exact optimum serves the 5 GB model instead and
places two replicas more. The split and twin trades never drop a model's last replica, and
every other repair keeps each placed replica, so none of them makes this trade. This pass
does, on the plan the planner keeps (nothing staged), for the short models in round order
(highest class first):

* a new replica ``z`` of the short model ``x``'s class on a host ``a`` leaves the plan (it
  may be its model's last) and ``x`` takes ``a``; ``z``'s model must hold more replicas
  than ``x``'s before the trade, so the class's least-served model is no worse off and the
  class neither loses a replica nor leaves more of its models unserved;
* ``z`` never leaves when its model's attributable harm
  (:meth:`~grid_core.demand.types.ModelDemand.harm`) is higher than ``x``'s (a tie is
  allowed: the count decides), nor when ``x``'s next replica belongs to a later placement
  phase than ``z``'s (:func:`~grid_core.planner.phases.replica_phase`: a configured
  baseline replica never makes way for demand);
* ``z``'s model keeps its failure-domain spread as far as its remaining replicas can cover
  it;
* then the short models of ``x``'s class and the classes below (``z``'s model among them)
  land directly where they fit, in round order, one replica each per round, while any lands;
* the trade is kept only when one of them landed (``x``'s class or a class below placed
  strictly more); otherwise the ledger is restored exactly.

Only new replicas leave (nothing live, no pin reservation, hold or replica on its cached
weights), every placement obeys the ledger's hard rules, classes above ``x``'s are not
touched and the classes below only gain: each kept trade is a better plan in priority order.
"""

from __future__ import annotations

from dataclasses import dataclass

from grid_core.planner.core import PlanState
from grid_core.planner.exchange import (
    land_short,
    movables,
    open_candidates,
    short_by_round,
    spread,
    spread_kept,
)
from grid_core.planner.ledger import Placed
from grid_core.planner.phases import replica_phase, round_key

CLASS_TRADE_BUDGET = 4_000
"""Steps (a short model's candidate host examined, a trade tried) the class trades of one
plan may take together. A fleet of the property test (tests/benchmarks/
test_plan_exact_property.py: at most 8 hosts and 6 models) takes at most 48 per search; on
the 64x32 fleets at occupancy 0 (every fifth of seeds 1-260) a plan examines 125 hosts on
average and the pass takes 0.12 ms of CPU at the median, 0.55 ms at most (3.3 ms on the
1024x128 bench fleet), so the budget only bounds pathological inputs."""


@dataclass(slots=True)
class _Search:
    """The plan being repaired, candidate-host sets per model and the steps spent."""

    state: PlanState
    cand_sets: list[set[int]]
    spent: int = 0

    def step(self) -> bool:
        """Count one step; True once the budget is exceeded."""
        self.spent += 1
        return self.spent > CLASS_TRADE_BUDGET


def class_trades(state: PlanState) -> int:
    """Make class trades, one at a time from the highest class with a short model, until
    none is found or :data:`CLASS_TRADE_BUDGET` is spent; returns the replicas the trades
    added (net, over every class)."""
    search = _Search(state, [set(hs) for hs in state.cands])
    before = sum(state.ledger.count)
    profiles = state.profiles
    while search.spent <= CLASS_TRADE_BUDGET:
        short = short_by_round(state)
        made = False
        for x in short:  # highest class first, round order inside it
            prio = profiles[x].priority
            others = [y for y in short if y != x and profiles[y].priority <= prio]
            if others and _trade_one(search, x, prio, others):
                made = True
                break
            if search.spent > CLASS_TRADE_BUDGET:
                break
        if not made:
            break
    return sum(state.ledger.count) - before


def _trade_one(search: _Search, x: int, prio: int, others: list[int]) -> bool:
    """One class trade for the short model ``x`` of class ``prio``; ``others`` are the other
    short models of that class and the classes below. True when made (else the ledger is
    unchanged)."""
    state = search.state
    ledger = state.ledger
    count = ledger.count
    profiles = state.profiles
    gain = replica_phase(state, x, count[x] + 1)
    x_harm = round_key(state, x)[3]  # attributable harm, negated (remembered per plan)
    for a in list(open_candidates(state, x)):
        if search.step():
            return False
        leaving = [
            z
            for z in movables(state, a, largest_first=True)
            if profiles[z.mi].priority == prio  # its class only,
            and count[z.mi] > count[x]  # from a model served more than ``x``,
            and round_key(state, z.mi)[3] >= x_harm  # not more harmed than ``x``,
            and replica_phase(state, z.mi, count[z.mi]) >= gain  # of no earlier phase
        ]
        if not leaving:
            continue
        lower = [y for y in others if a in search.cand_sets[y]]
        if not lower:
            continue  # no other short model could use what the trade leaves on ``a``
        for z in leaving:
            if ledger.fit_after_leaving(x, a, z) is not None:
                continue
            if not _lower_may_fit(state, a, x, z, lower):
                continue
            if search.step():
                return False
            if _apply(state, a, x, z, prio):
                return True
    return False


def _lower_may_fit(state: PlanState, a: int, x: int, z: Placed, lower: list[int]) -> bool:
    """Quick test whether one of the short models ``lower`` could take ``a`` once ``z`` has
    left and ``x`` has arrived: a slot to spare and memory for it there (admission headroom
    not counted: a necessary condition, never a sufficient one)."""
    book = state.ledger.books[a]
    if book.max_models and len(book.present) >= book.max_models:
        return False  # ``z`` leaves and ``x`` arrives: the count of models stays
    room = min(book.inc_free + z.inc_mb, book.raw_free + z.raw_mb) - state.mem_rows[x][a]
    profiles = state.profiles
    return any(
        state.mem_rows[y][a] <= room and profiles[y].model_id not in book.present for y in lower
    )


def _apply(state: PlanState, a: int, x: int, z: Placed, prio: int) -> bool:
    """Drop ``z`` from ``a``, place ``x`` there, then let the short models of class
    ``prio`` and below (``z``'s among them) land directly (round order, one
    replica each per round) while any lands; False (ledger restored exactly) when ``x``
    does not fit, ``z``'s model would lose failure-domain spread its remaining replicas can
    cover, or nothing landed (neither class ``prio`` nor any class below it gained)."""
    ledger = state.ledger
    before = spread(state, z.mi)
    ledger.remove(z.mi, a)
    if not spread_kept(state, z.mi, before) or ledger.fit_new(x, a) is not None:
        ledger.place(z.mi, a, z.reason, z.score)
        return False
    ledger.place(x, a, "repair", state.score_now(x, a))
    if land_short(state, prio):
        return True
    ledger.remove(x, a)
    ledger.place(z.mi, a, z.reason, z.score)
    return False
