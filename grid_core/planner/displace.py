"""Lower-class displacement: a short model takes a slot-limited host from new replicas of
lower classes, moving the new replicas of its own or higher classes there elsewhere.

Source: specification, "Global placement loop" (priority classes place high to low; a
deterministic, bounded repair may evacuate and re-place replicas when greedy placement
fragments capacity) and "Safety invariants" 1 and 2 (live work is never disturbed).

The classes place one after another and the fair rounds give each model one replica per
round, so medium replicas can take the model slots of the roomy slot-limited hosts before a
large replica of the same or a lower class finds one (64x32 seed 6: the 45 GB priority-1
model gets 15 of 19 replicas while 54 GB three-slot hosts hold a 5 GB priority-2 replica
beside two priority-0 ones). The repairs before this pass only *move* replicas, so none
ever trades lower-class replicas for a higher-class one. This pass does, on the plan the
planner keeps (nothing staged):

* for a model ``x`` still short, above the lowest class, a candidate host ``a`` with a
  model-slot ceiling where ``x`` fits once a minimal set (no member could stay) of at most
  :data:`DISPLACE_MAX_LEAVING` new replicas leaves it;
* members of a class below ``x``'s leave the plan; the others move to their best host where
  they fit now, or to a host where one or two new lower-class replicas leave the plan for
  them (:func:`_land_by_drop`);
* sets that drop the fewest replicas are tried first; a trade is applied whole or not at
  all, no moved model spans fewer failure domains than before, and a model that loses
  replicas spans no fewer than before or than its remaining replicas can (a failure-domain
  minimum is a hard rule where the replicas can meet it: the trade may cut a model's spread
  only as far as it cuts its count; :func:`~grid_core.planner.exchange.spread_kept`);
* the models that lost replicas then land directly where they fit (the passes after this
  one may place them too).

Only new replicas leave (nothing live, no pin reservation, hold or replica on its cached
weights) and every move obeys the ledger's hard rules. Each trade places one more replica
of ``x``'s class, and no class above it loses one: a better plan in priority order, at the
price of lower-class replicas that were only planned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

from grid_core.planner.core import PlanState
from grid_core.planner.exchange import (
    is_short,
    movables,
    place_direct,
    repairable_hosts,
    short_by_round,
    spread,
    spread_kept,
)
from grid_core.planner.ledger import Placed
from grid_core.planner.phases import round_key

DISPLACE_BUDGET = 300
"""Steps (each set of leaving replicas that frees enough memory, counted as found, and each
trade tried) the displacements of one plan may take together. On the 64x32 fleets at
occupancy 0 (seeds 1-260) 150 to 600 place the same; a plan where no trade works ends its
search earlier (every member that found no landing is remembered until a trade succeeds)."""

DISPLACE_MAX_LEAVING = 3
"""Most new replicas that leave one host for one replica of the short model (a host with a
ceiling of three slots can be emptied)."""

LAND_MAX_DROPPED = 2
"""Most lower-class replicas that leave the plan so one moved member can land on a host."""


@dataclass(slots=True)
class _Search:
    """The plan being repaired, the steps spent and what failed since the last trade."""

    state: PlanState
    limit: int = DISPLACE_BUDGET
    spent: int = 0
    homeless: set[int] = field(default_factory=set)
    """Models a moved member of which found no landing since the last trade: a set that
    would move one of them again is skipped until the plan changes."""

    def step(self, n: int = 1) -> bool:
        """Count ``n`` steps; True once the budget is exceeded."""
        self.spent += n
        return self.spent > self.limit


def displace_rounds(state: PlanState) -> int:
    """Give each model still short above the lowest class one more replica per round (a
    direct landing, else a displacement) until a round adds none or the budget is spent,
    then let every model that lost a replica land directly where it fits. Returns the
    replicas added to the short models."""
    lowest = min((p.priority for p in state.profiles), default=0)
    short = [mi for mi in short_by_round(state) if state.profiles[mi].priority > lowest]
    if not short:
        return 0
    search = _Search(state)
    dropped: set[int] = set()
    added = 0
    while short:
        progress = False
        for mi in short:
            if search.spent >= search.limit:
                break
            if place_direct(state, mi) or _displace_one(search, mi, dropped):
                added += 1
                progress = True
        if not progress:
            break
        short = [mi for mi in short if is_short(state, mi)]
    for mi in sorted(dropped, key=lambda mi: round_key(state, mi)):
        while is_short(state, mi) and place_direct(state, mi):
            pass
    return added


def _displace_one(search: _Search, xi: int, dropped: set[int]) -> bool:
    """Place one replica of ``xi`` on a slot-limited candidate host by a displacement;
    True when placed (the models that lost a replica are added to ``dropped``), else the
    ledger is unchanged."""
    state = search.state
    ledger = state.ledger
    mems = state.mem_rows[xi]
    prio = state.profiles[xi].priority
    for a in repairable_hosts(state, xi, slot_free=False):
        book = ledger.books[a]
        if not book.max_models:
            continue
        leaving = movables(state, a, largest_first=False)
        if not leaving:
            continue
        short_inc = mems[a] + ledger.headroom_extra(xi, a) - book.inc_free
        short_raw = mems[a] - book.raw_free
        if not _may_free(leaving, short_inc, short_raw):
            continue  # no set small enough frees the room (listing them would cost C(n, 3))
        slot_full = len(book.present) >= book.max_models
        sets = _minimal_sets(leaving, short_inc, short_raw, slot_full)
        if not sets:
            continue
        if search.step(len(sets)):
            return False
        drop = {p.mi for p in leaving if _droppable(state, p, prio)}
        sets.sort(key=lambda g: (sum(p.mi in drop for p in g), len(g)))
        for group in sets:
            if any(p.mi in search.homeless and p.mi not in drop for p in group):
                continue
            if search.step():
                return False
            lost = _apply(search, xi, a, group, drop)
            if lost is not None:
                dropped.update(lost)
                search.homeless.clear()
                return True
    return False


def _droppable(state: PlanState, p: Placed, prio: int) -> bool:
    """Whether the new replica ``p`` may leave the plan for a model of priority ``prio``:
    its model's class is lower (the order in which the classes place says the same)."""
    return state.profiles[p.mi].priority < prio


def _may_free(leaving: Sequence[Placed], short_inc: int, short_raw: int) -> bool:
    """Whether the :data:`DISPLACE_MAX_LEAVING` replicas of ``leaving`` that free the most
    could free ``short_inc`` incremental and ``short_raw`` desired-ledger MB (each ledger
    on its own): a necessary condition for :func:`_minimal_sets` to find any set, in
    O(n log n) where listing the sets costs O(n^3) and counts no step when none frees
    enough."""
    k = DISPLACE_MAX_LEAVING
    top_inc = sum(sorted((p.inc_mb for p in leaving), reverse=True)[:k])
    top_raw = sum(sorted((p.raw_mb for p in leaving), reverse=True)[:k])
    return top_inc >= short_inc and top_raw >= short_raw


def _minimal_sets(
    leaving: Sequence[Placed], short_inc: int, short_raw: int, slot_full: bool
) -> list[tuple[Placed, ...]]:
    """Sets of at most :data:`DISPLACE_MAX_LEAVING` of ``leaving`` whose departure frees
    ``short_inc`` incremental and ``short_raw`` desired-ledger MB (and a model slot on a
    ``slot_full`` host) and that no member could be left out of; fewest members first, in
    combination order."""
    out: list[tuple[Placed, ...]] = []
    covered: set[tuple[int, ...]] = set()
    for k in range(1, min(DISPLACE_MAX_LEAVING, len(leaving)) + 1):
        for idx in combinations(range(len(leaving)), k):
            group = tuple(leaving[i] for i in idx)
            if sum(p.inc_mb for p in group) < short_inc or sum(p.raw_mb for p in group) < short_raw:
                continue
            covered.add(idx)
            if k > 1 and any(sub in covered for sub in combinations(idx, k - 1)):
                continue  # a smaller set frees enough already
            if k > 1 or slot_full or short_inc > 0 or short_raw > 0:
                out.append(group)
    return out


def _apply(
    search: _Search, xi: int, a: int, group: tuple[Placed, ...], drop: set[int]
) -> list[int] | None:
    """Take ``group`` off ``a``, place ``xi`` there and land each member not in ``drop``
    (its best host, else :func:`_land_by_drop`). Returns the models that lost a replica,
    or ``None`` with the ledger restored when a member finds no landing or a moved model
    would span fewer failure domains than before."""
    state = search.state
    ledger = state.ledger
    prio = state.profiles[xi].priority
    kept = {p.mi: spread(state, p.mi) for p in group if p.mi not in drop}
    spans = [spread(state, m) for m in range(len(state.profiles))]
    for p in group:
        ledger.remove(p.mi, a)
    moved: list[tuple[int, int]] = []
    gone: list[Placed] = []
    if ledger.fit_new(xi, a) is None:
        ledger.place(xi, a, "repair", state.score_now(xi, a))
        ok = True
        for p in sorted(group, key=lambda p: (-p.memory_mb, p.mi)):
            if p.mi in drop:
                continue
            found = state.best_host(p.mi)
            if found is not None:
                ledger.place(p.mi, found[0], "repair", found[1])
                moved.append((p.mi, found[0]))
                continue
            got = _land_by_drop(state, p.mi, a, prio)
            if got is None:
                search.homeless.add(p.mi)
                ok = False
                break
            moved.append((p.mi, got[0].hi))
            gone += got
        lost = [p.mi for p in group if p.mi in drop] + [r.mi for r in gone]
        if (
            ok
            and all(spread(state, m) >= n for m, n in kept.items())
            and all(spread_kept(state, m, spans[m]) for m in lost)
        ):
            return lost
        for m, h in reversed(moved):
            ledger.remove(m, h)
        for r in gone:
            ledger.place(r.mi, r.hi, r.reason, r.score)
        ledger.remove(xi, a)
    for p in group:
        ledger.place(p.mi, a, p.reason, p.score)
    return None


def _land_by_drop(state: PlanState, m: int, a: int, prio: int) -> list[Placed] | None:
    """Land the moved member ``m`` on a candidate host (not ``a``) where one or two
    (:data:`LAND_MAX_DROPPED`) new replicas of classes below ``prio`` make room by leaving
    the plan; returns them, or ``None`` (ledger unchanged)."""
    ledger = state.ledger
    books = ledger.books
    mid = state.profiles[m].model_id
    mems = state.mem_rows[m]
    for b in state.cands[m]:
        book = books[b]
        if b == a or book.blocked or not book.eligible or mid in book.present:
            continue
        rs = [r for r in movables(state, b, largest_first=True) if _droppable(state, r, prio)]
        if not rs:
            continue
        need = mems[b] + ledger.headroom_extra(m, b)
        top = rs[:LAND_MAX_DROPPED]
        if book.inc_free + sum(r.inc_mb for r in top) < need:
            continue  # quick: even the largest of them leave too little
        for r in reversed(rs):  # the smallest that makes room first
            if ledger.fit_after_leaving(m, b, r) is None:
                return _land(state, m, b, (r,))
        for i, r1 in enumerate(rs):
            for r2 in rs[i + 1 :]:
                if book.inc_free + r1.inc_mb + r2.inc_mb < need:
                    break  # sorted largest first: every later partner frees less
                if book.raw_free + r1.raw_mb + r2.raw_mb < mems[b]:
                    continue
                got = _land(state, m, b, (r1, r2))
                if got is not None:
                    return got
    return None


def _land(state: PlanState, m: int, b: int, rs: tuple[Placed, ...]) -> list[Placed] | None:
    """Drop ``rs`` from ``b`` and place ``m`` there; ``None`` (``rs`` restored) when ``m``
    still does not fit."""
    ledger = state.ledger
    for r in rs:
        ledger.remove(r.mi, b)
    if ledger.fit_new(m, b) is not None:
        for r in rs:
            ledger.place(r.mi, b, r.reason, r.score)
        return None
    ledger.place(m, b, "repair", state.score_now(m, b))
    return list(rs)
