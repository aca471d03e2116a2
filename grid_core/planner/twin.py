"""Twin trade: one new replica leaves the plan so that a short model of its class places two.

Source: specification, "Global placement loop" (a deterministic, bounded repair may
re-place new replicas when greedy placement fragments capacity).

What the earlier passes leave short on the 64x32 fleets is mostly the lowest class, and the
smallest change to Grid's plan that places one more replica there often removes one: on
seed 256 the exact program drops a priority-0 replica from a slot-full six-slot server, a
45 GB priority-2 replica moves into its place, the short model takes the room it leaves,
and a second replica of the short model takes a host whose new replica moves to that same
roomy host. The other repairs keep every placed replica, so none makes that trade. This pass
does, after the split trades (only the deep chains follow it), on the plan the planner keeps
(nothing staged), for the short models of the lowest class that still has any:

* a new replica ``z`` of that class on a host ``a`` (never its model's last replica, and
  its model keeps its failure-domain spread) leaves the plan;
* the short model ``y`` takes ``a`` itself, or a host ``b`` whose new replica ``w`` moves to
  ``a`` (``y`` fits ``b`` once ``w`` has left);
* a second replica of ``y`` then takes ``a``, or a host whose new replica moves to ``a`` or
  ``b`` (the only hosts the first step changed);
* ``z``'s model may land directly elsewhere afterwards;
* ``z`` never leaves when ``y``'s next replica belongs to a later placement phase than
  ``z``'s own (:func:`~grid_core.planner.phases.replica_phase`): a required baseline
  replica does not make way for demand, nor a direct-demand one for prewarms.

Each move obeys the ledger's hard rules and no moved model spans fewer failure domains; a
trade is applied whole or not at all. Only new replicas move or leave (nothing live, no pin
reservation, hold or replica on its cached weights), so each trade places one more replica
in that class and changes no other class.
"""

from __future__ import annotations

from dataclasses import dataclass

from grid_core.planner.core import PlanState
from grid_core.planner.exchange import (
    land_short,
    movables,
    place_direct,
    short_by_round,
    spread,
)
from grid_core.planner.ledger import Placed
from grid_core.planner.phases import replica_phase

TWIN_BUDGET = 10_000
"""Steps (a short model's candidate hosts listed, a leaving pair compared with a dropped
replica's room, a first step tried) the twin trades of one plan may take together. On the
64x32 fleets at occupancy 0 (seeds 1-260), with the displacement and split passes, 2,500 /
5,000 / 10,000 / 20,000 steps add 15 / 28 / 45 / 50 replicas and leave 23 / 21 / 21 / 21
seeds more than 0.02 below the optimum (24 before); the three passes together then take
1.9 / 3.1 / 4.1 / 5.4 ms of CPU at the 90th percentile of those plans (7.8 ms at most with
10,000). A quick test of memory and slots (:func:`_second_may_fit`) skips most first steps
that could not be followed by a second."""

Pair = tuple[int, Placed]
"""(host ``b``, new replica ``w`` on it) such that the short model fits ``b`` once ``w``
has left."""


@dataclass(slots=True)
class _Search:
    """The plan being repaired, candidate-host sets per model and the steps spent."""

    state: PlanState
    cand_sets: list[set[int]]
    spent: int = 0

    def step(self, n: int = 1) -> bool:
        """Count ``n`` steps; True once the budget is exceeded."""
        self.spent += n
        return self.spent > TWIN_BUDGET


def twin_rounds(state: PlanState) -> int:
    """Make twin trades for the short models of the lowest class that has any, one at a
    time in round order, until none is found or the budget is spent, then take off every
    replica beyond what its model needs (:func:`trim_surplus`); returns the replicas added
    (net of those taken off)."""
    before = sum(state.ledger.count)
    _trades(state)
    trim_surplus(state)
    return sum(state.ledger.count) - before


def trim_surplus(state: PlanState) -> int:
    """Take off the new replicas a model holds beyond :meth:`PlanState.needed` (a twin
    trade for a model one replica short places two), lowest placement score first, keeping
    the model's failure-domain spread; then give the models still short a direct landing
    each, in round order, while any lands. Returns the replicas taken off. Only new
    replicas leave (nothing live, no pin reservation, hold or replica on its cached
    weights)."""
    ledger = state.ledger
    taken = 0
    for mi in range(len(state.profiles)):
        extra = ledger.count[mi] - state.needed(mi)
        if extra <= 0:
            continue
        mine = [p for hi in state.cands[mi] for p in movables(state, hi, False) if p.mi == mi]
        mine.sort(key=lambda p: (p.score if p.score is not None else 0.0, -p.hi))
        for p in mine:
            if extra <= 0:
                break
            spans = spread(state, mi)
            ledger.remove(mi, p.hi)
            if spread(state, mi) < spans:
                ledger.place(mi, p.hi, p.reason, p.score)
                continue
            extra -= 1
            taken += 1
    if taken:
        land_short(state)
    return taken


def _trades(state: PlanState) -> int:
    """The twin trades of :func:`twin_rounds`; returns how many were made."""
    search = _Search(state, [set(hs) for hs in state.cands])
    added = 0
    while search.spent <= TWIN_BUDGET:
        short = short_by_round(state)
        if not short:
            return added
        low = min(state.profiles[mi].priority for mi in short)
        for y in (mi for mi in short if state.profiles[mi].priority == low):
            if _twin_one(search, y):
                added += 1
                break
            if search.spent > TWIN_BUDGET:
                return added
        else:
            return added
    return added


def _leave_pairs(search: _Search, y: int, hosts: list[int] | tuple[int, ...]) -> list[Pair]:
    """The :data:`Pair`\\ s of ``y`` on ``hosts`` (its candidates without a replica of it)."""
    state = search.state
    ledger = state.ledger
    books = ledger.books
    mid = state.profiles[y].model_id
    out: list[Pair] = []
    for b in hosts:
        book = books[b]
        if book.blocked or not book.eligible or mid in book.present:
            continue
        for w in movables(state, b, largest_first=False):
            if ledger.fit_after_leaving(y, b, w) is None:
                out.append((b, w))
    return out


def _twin_one(search: _Search, y: int) -> bool:
    """One twin trade for the short model ``y``; True when made (else the ledger is
    unchanged)."""
    state = search.state
    ledger = state.ledger
    books = ledger.books
    if search.step(len(state.cands[y])):
        return False
    pairs = _leave_pairs(search, y, state.cands[y])
    if not pairs:
        return False
    pairs.sort(key=lambda bw: (bw[1].memory_mb, bw[0], bw[1].mi))
    prio = state.profiles[y].priority
    y_cands = search.cand_sets[y]
    y_id = state.profiles[y].model_id
    gain = replica_phase(state, y, ledger.count[y] + 1)
    for a, book in enumerate(books):
        if book.blocked or not book.eligible:
            continue
        for z in movables(state, a, largest_first=True):
            if state.profiles[z.mi].priority != prio or ledger.count[z.mi] <= 1:
                continue  # its class only, and never a model's last replica
            if replica_phase(state, z.mi, ledger.count[z.mi]) < gain:
                continue  # a replica of an earlier phase than ``y``'s next one stays
            room = min(book.inc_free + z.inc_mb, book.raw_free + z.raw_mb)
            opts: list[tuple[int, Placed | None]] = []
            if a in y_cands and y_id not in book.present and state.mem_rows[y][a] <= room:
                opts.append((a, None))
            for b, w in pairs:
                if search.step():
                    return False
                if w.memory_mb > room:
                    break  # sorted by size: the rest are larger still
                if b == a or a not in search.cand_sets[w.mi] or state.mem_rows[w.mi][a] > room:
                    continue
                if state.profiles[w.mi].model_id not in book.present:
                    opts.append((b, w))
            if opts and _try_drop(search, y, a, z, opts, pairs):
                return True
    return False


def _try_drop(
    search: _Search,
    y: int,
    a: int,
    z: Placed,
    opts: list[tuple[int, Placed | None]],
    pairs: list[Pair],
) -> bool:
    """Drop ``z`` from ``a`` and try each first step of ``opts``; True when a whole trade was
    made (``z``'s model then lands directly elsewhere if it can), else everything restored."""
    state = search.state
    ledger = state.ledger
    before = spread(state, z.mi)
    ledger.remove(z.mi, a)
    if spread(state, z.mi) >= before:
        for b, w in opts:
            if search.step():
                break
            if not _second_may_fit(search, y, a, b, w, pairs):
                continue
            if _apply(search, y, a, b, w, pairs):
                place_direct(state, z.mi)
                return True
    ledger.place(z.mi, a, z.reason, z.score)
    return False


def _second_may_fit(
    search: _Search, y: int, a: int, b: int, w: Placed | None, pairs: list[Pair]
) -> bool:
    """Quick test whether :func:`_second` could find anything after the first step: the
    memory and model slots that step would leave on ``a`` and ``b`` (admission headroom
    counted only for ``y`` on ``a``; a necessary condition, never a sufficient one)."""
    state = search.state
    books = state.ledger.books
    book_a = books[a]
    rooms = {a: min(book_a.inc_free, book_a.raw_free)}  # ``z`` has left ``a`` already
    if w is None:  # ``y`` takes ``a`` (and one of its slots)
        rooms[a] -= state.mem_rows[y][a]
    else:  # ``w`` replaces ``z`` on ``a``, ``y`` replaces ``w`` on ``b``
        book_b = books[b]
        rooms[a] -= state.mem_rows[w.mi][a]
        rooms[b] = min(book_b.inc_free, book_b.raw_free) + w.memory_mb - state.mem_rows[y][b]
    for t in list(rooms):
        book = books[t]
        used = len(book.present) + (t == a)  # ``a`` gains a model (``z`` has left already)
        if rooms[t] <= 0 or (book.max_models and used >= book.max_models):
            del rooms[t]
    if not rooms:
        return False
    ledger = state.ledger
    y_id = state.profiles[y].model_id
    if w is not None and a in rooms and a in search.cand_sets[y] and y_id not in book_a.present:
        share = max(ledger.headroom_extra(y, a), ledger.headroom_extra(w.mi, a), book_a.extra_mb)
        need, w_mem = state.mem_rows[y][a], state.mem_rows[w.mi][a]
        if book_a.inc_free - w_mem >= need + share and book_a.raw_free - w_mem >= need:
            return True  # ``y`` itself fits ``a`` beside ``w`` (as fit_new would say)
    profiles = state.profiles
    moved = None if w is None else profiles[w.mi].model_id
    for b2, w2 in pairs:
        if b2 in (a, b):
            continue
        for t, room in rooms.items():
            if t not in search.cand_sets[w2.mi] or state.mem_rows[w2.mi][t] > room:
                continue
            w2_id = profiles[w2.mi].model_id
            if w2_id == moved or (w2_id in books[t].present and not (t == b and w2_id == moved)):
                continue  # (a model is on a host once: ``w``'s arrives on ``a``)
            return True
    return False


def _apply(search: _Search, y: int, a: int, b: int, w: Placed | None, pairs: list[Pair]) -> bool:
    """First step (``y`` on ``a``, or ``w`` from ``b`` to ``a`` and ``y`` on ``b``), then a
    second replica of ``y`` (:func:`_second`); False with the ledger restored when either
    does not work."""
    state = search.state
    ledger = state.ledger
    if w is None:
        if ledger.fit_new(y, a) is not None:
            return False
        ledger.place(y, a, "repair", state.score_now(y, a))
        if _second(search, y, a, a, pairs):
            return True
        ledger.remove(y, a)
        return False
    cur = ledger.books[b].models.get(w.mi)
    if cur is None or not _move_for(search, y, b, w, a):
        return False
    if _second(search, y, a, b, pairs):
        return True
    ledger.remove(y, b)
    ledger.remove(w.mi, a)
    ledger.place(w.mi, b, cur.reason, cur.score)
    return False


def _second(search: _Search, y: int, a: int, b: int, pairs: list[Pair]) -> bool:
    """A second replica of ``y`` after the first step changed hosts ``a`` and ``b``: on
    ``a`` directly, or on a host whose new replica moves to ``a`` or ``b`` (nothing else
    changed, so nothing else can have room for it now). False leaves the ledger as it was."""
    state = search.state
    ledger = state.ledger
    books = ledger.books
    if a in search.cand_sets[y] and ledger.fit_new(y, a) is None:
        ledger.place(y, a, "repair", state.score_now(y, a))
        return True
    targets = [
        t
        for t in dict.fromkeys((a, b))
        if not (books[t].max_models and len(books[t].present) >= books[t].max_models)
    ]
    room = {t: min(books[t].inc_free, books[t].raw_free) for t in targets}
    for b2, w2 in pairs if targets else ():
        if search.step():
            return False
        if b2 in (a, b):
            continue
        for t in targets:
            if t not in search.cand_sets[w2.mi] or state.mem_rows[w2.mi][t] > room[t]:
                continue
            if _move_for(search, y, b2, w2, t):
                return True
    return False


def _move_for(search: _Search, y: int, b2: int, w2: Placed, t: int) -> bool:
    """Move ``w2`` from ``b2`` to ``t`` and place ``y`` on ``b2``; False (ledger unchanged)
    when either does not fit or ``w2``'s model would span fewer failure domains."""
    state = search.state
    ledger = state.ledger
    cur = ledger.books[b2].models.get(w2.mi)
    if cur is None or state.profiles[w2.mi].model_id in ledger.books[t].present:
        return False
    if ledger.fit_after_leaving(y, b2, cur) is not None:
        return False
    before = spread(state, w2.mi)
    ledger.remove(w2.mi, b2)
    if ledger.fit_new(w2.mi, t) is None:
        ledger.place(w2.mi, t, "repair", state.score_now(w2.mi, t))
        if ledger.fit_new(y, b2) is None and spread(state, w2.mi) >= before:
            ledger.place(y, b2, "repair", state.score_now(y, b2))
            return True
        ledger.remove(w2.mi, t)
    ledger.place(w2.mi, b2, cur.reason, cur.score)
    return False
