"""Split trade: one new replica of a class leaves the plan so that two short models of the
same class each place a replica in its place.

Source: specification, "Global placement loop" (a deterministic, bounded repair may
re-place replicas when greedy placement fragments capacity).

The fair rounds give every model of a class one replica per round, so a large replica can
hold a host's memory or its last model slot where two smaller short models of the same class
would both fit (64x32 seed 162: the exact optimum places fewer of a large priority-0 model
and more of a small one). Every other repair keeps each placed replica, so none makes that
trade. This pass runs after the displacement and before the twin trades, on the plan the
planner keeps (nothing staged), for classes with two or more short models, highest class
first:

* a new replica ``z`` of the class on host ``a`` (never its model's last replica; its
  model may be short itself) leaves the plan, and two other short models of the class that
  are not on ``a`` both fit there once it has left; ``z``'s model may then land directly
  elsewhere;
* the trade is kept only when both fit every hard rule of the ledger and ``z``'s model
  spans no fewer failure domains than before; otherwise the ledger is restored;
* ``z`` never leaves for two replicas that both belong to a later placement phase than its
  own (:func:`~grid_core.planner.phases.replica_phase`): a model's required baseline
  replica does not make way for demand, nor a direct-demand one for two prewarms.

Only new replicas leave (nothing live, no pin reservation, hold or replica on its cached
weights). Each trade places one replica more in its class and changes no other class.
"""

from __future__ import annotations

from grid_core.planner.core import PlanState
from grid_core.planner.exchange import movables, place_direct, short_by_round, spread
from grid_core.planner.ledger import Placed
from grid_core.planner.phases import replica_phase

SPLIT_BUDGET = 3_000
"""Pairs of short models the split trades of one plan may try (each one passes a quick
memory test first). On the 64x32 fleets at occupancy 0 (seeds 1-260) 3,000 and 10,000
place the same; a plan where nothing more fits spends 0.2-2 ms of CPU here."""

SPLIT_SCAN_BUDGET = 50_000
"""Quick memory tests (a leaving replica against the two smallest short models, a pair
against the room it leaves) the split trades of one plan may make together. The 289
bench fleets make at most a few hundred; a large one-class fleet where almost no pair fits
(256 hosts of four slots, 64 short models) made 7.3 million (430 ms) before this bound."""


def split_rounds(state: PlanState) -> int:
    """Make split trades, one at a time from the highest class with two short models,
    until none is found or a budget is spent; returns the replicas added."""
    added = 0
    spent = [0, 0]  # pairs tried, quick tests made
    while spent[0] <= SPLIT_BUDGET and spent[1] <= SPLIT_SCAN_BUDGET:
        short = short_by_round(state)
        classes = sorted({state.profiles[mi].priority for mi in short}, reverse=True)
        for prio in classes:
            xs = [mi for mi in short if state.profiles[mi].priority == prio]
            if len(xs) > 1 and _split_one(state, xs, prio, spent):
                added += 1
                break
        else:
            return added
    return added


def _split_one(state: PlanState, xs: list[int], prio: int, spent: list[int]) -> bool:
    """One split trade for two of the short models ``xs`` (class ``prio``, round order);
    True when made (else the ledger is unchanged). ``spent`` counts the pairs tried and
    the quick tests made (:data:`SPLIT_BUDGET`, :data:`SPLIT_SCAN_BUDGET`)."""
    books = state.ledger.books
    count = state.ledger.count
    cand = [set(state.cands[mi]) for mi in xs]
    gain = {mi: replica_phase(state, mi, count[mi] + 1) for mi in xs}
    for a in sorted(set().union(*cand)):
        book = books[a]
        if book.blocked or not book.eligible:
            continue
        here = [
            mi
            for i, mi in enumerate(xs)
            if a in cand[i] and state.profiles[mi].model_id not in book.present
        ]
        if len(here) < 2:
            continue
        least = sum(sorted(state.mem_rows[mi][a] for mi in here)[:2])
        for z in movables(state, a, largest_first=True):
            if state.profiles[z.mi].priority != prio or count[z.mi] <= 1:
                continue  # its class only, and never a model's last replica
            lose = replica_phase(state, z.mi, count[z.mi])
            room_inc = book.inc_free + z.inc_mb
            room_raw = book.raw_free + z.raw_mb
            spent[1] += 1
            if spent[1] > SPLIT_SCAN_BUDGET:
                return False
            if least > room_inc or least > room_raw:
                continue  # quick: not even the two smallest fit where ``z`` was
            for j, x in enumerate(here):  # (``z``'s model is on ``a``, so not among them)
                mx = state.mem_rows[x][a]
                for y in here[j + 1 :]:
                    if gain[x] > lose and gain[y] > lose:
                        continue  # both of a later phase than ``z``: the class order forbids
                    spent[1] += 1
                    if spent[1] > SPLIT_SCAN_BUDGET:
                        return False
                    both = mx + state.mem_rows[y][a]
                    if both > room_inc or both > room_raw:
                        continue  # quick: the two do not fit where ``z`` was
                    spent[0] += 1
                    if spent[0] > SPLIT_BUDGET:
                        return False
                    if _apply(state, a, z, x, y):
                        return True
    return False


def _apply(state: PlanState, a: int, z: Placed, x: int, y: int) -> bool:
    """Drop ``z`` from ``a`` and place ``x`` and ``y`` there, then let ``z``'s model land
    directly elsewhere; False (ledger restored) when either does not fit or ``z``'s
    model would span fewer failure domains."""
    ledger = state.ledger
    before = spread(state, z.mi)
    ledger.remove(z.mi, a)
    placed: list[int] = []
    for m in (x, y):
        if ledger.fit_new(m, a) is not None:
            break
        ledger.place(m, a, "repair", state.score_now(m, a))
        placed.append(m)
    if len(placed) == 2 and spread(state, z.mi) >= before:
        place_direct(state, z.mi)
        return True
    for m in reversed(placed):
        ledger.remove(m, a)
    ledger.place(z.mi, a, z.reason, z.score)
    return False
