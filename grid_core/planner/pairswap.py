"""Pair exchange: place a short model by trading one large new replica for two smaller ones.

Source: specification, "Global placement loop": a deterministic, bounded repair may evacuate
and re-place replicas when greedy placement fragments capacity, and a host's model slots are
a hard limit that placement should spend where memory per slot fits the replica.

A large replica alone on a host with slots to spare can fill its memory and strand those
slots (a 45 GB replica on a three-slot 54 GB host leaves two slots nobody can use), while a
host with more memory elsewhere is slot-full with medium replicas. The exchange repair
(:mod:`grid_core.planner.exchange`) trades one replica for one, and the chains move one
replica per host, so neither helps when the large replica needs *two* others to leave. This
pass makes that trade:

* host ``a`` (a candidate of the short model ``x``) holds a new replica ``big`` whose
  departure lets ``x`` fit there, and has model slots for :data:`PAIR_NEWCOMERS` newcomers
  once ``big`` has left (``x`` and two more);
* host ``b`` holds two new replicas ``s1``, ``s2`` whose departure together lets ``big`` fit
  there; both land on ``a`` beside ``x``;
* when that plain search finds no pair (it has :data:`PAIR_EXCHANGE_BUDGET` steps), a
  wider one (its own :data:`PAIR_SWAP_BUDGET`) also takes pairs of any size, and a member
  that cannot join ``a`` lands on its best host where it fits now, or takes the place of a
  new replica ``r`` on a third host ``c`` whose departure makes room for it, ``r`` joining
  ``a`` or ``b`` instead (wherever it fits as the trade leaves them);
* all moves are applied together and kept only when each fits every hard rule of the ledger
  and no moved model spans fewer failure domains than before (up to what it requires);
  otherwise the ledger is restored exactly.

Only new replicas move (nothing live, no pin reservation or hold, no replica on a host that
holds its cached weights), so the pass only ever adds a replica of a short model: no class
places fewer. It runs after the long chains on the plan the planner keeps (and once more
after a displacement that placed anything, :mod:`.displace`), for the models still short
(highest priority first, one replica per model per round); a plan it does not change is
byte-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

from grid_core.planner.core import PlanState
from grid_core.planner.exchange import (
    is_short,
    movables,
    place_direct,
    repairable_hosts,
    short_by_round,
    spread,
)
from grid_core.planner.ledger import Placed

PAIR_EXCHANGE_BUDGET = 1_500
"""Steps (a host examined as the large replica's destination, or a pair tried there) the
plain pair exchanges of one plan may take together. On the 64x32 fleets at occupancy 0
(seeds 1-200), without the wider search, 1,000 place 3 replicas more than the planner
without this pass and 1,500 to 6,000 all 5. A plan where nothing more fits spends it all
(about 1 ms of CPU on 64x32 seed 1)."""

PAIR_SWAP_BUDGET = 3_000
"""Steps (as above, plus a third host examined for a member's swap) the wider pair exchanges
of one plan may take together. With the plain budget above, on the same 200 fleets 1,000
place 2 replicas more than the plain search alone, 1,500 4, 2,000 7, 3,000 10, 4,000 and
6,000 12. A plan where nothing more fits spends it all: about 4 ms of CPU on 64x32 seed 1
at 3,000, 5.5 ms at 4,000."""

PAIR_NEWCOMERS = 3
"""Replicas that arrive on ``a`` once the large one leaves: the short model and the pair."""


@dataclass(slots=True)
class _Search:
    """One kind of pair exchange (``wide``: any pair, members may land elsewhere) and its
    budget of steps."""

    state: PlanState
    cand_sets: list[set[int]]
    wide: bool
    limit: int
    spent: int = 0

    def step(self, n: int = 1) -> bool:
        """Count ``n`` steps; True once the budget is exceeded."""
        self.spent += n
        return self.spent > self.limit

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.limit


def pair_exchange_rounds(state: PlanState) -> int:
    """Give short models one more replica per round (directly where an earlier trade left
    room, else by a plain pair exchange, else by a wider one) until none is found or both
    budgets are spent; returns the replicas added."""
    short = short_by_round(state)
    if not short:
        return 0
    cand_sets = [set(hs) for hs in state.cands]
    plain = _Search(state, cand_sets, wide=False, limit=PAIR_EXCHANGE_BUDGET)
    wide = _Search(state, cand_sets, wide=True, limit=PAIR_SWAP_BUDGET)
    added = 0
    while short:
        progress = False
        for mi in short:
            if plain.exhausted and wide.exhausted:
                return added
            if place_direct(state, mi) or _pair_exchange(plain, mi) or _pair_exchange(wide, mi):
                added += 1
                progress = True
        if not progress:
            break
        short = [mi for mi in short if is_short(state, mi)]
    return added


def _pair_exchange(search: _Search, xi: int) -> bool:
    """Place ``xi`` by one pair exchange; True when placed (else the ledger is unchanged)."""
    if search.exhausted:
        return False
    state = search.state
    ledger = state.ledger
    for a in repairable_hosts(state, xi, slot_free=True):
        book_a = ledger.books[a]
        if book_a.max_models and len(book_a.present) - 1 + PAIR_NEWCOMERS > book_a.max_models:
            continue
        for big in movables(state, a, largest_first=True):
            if ledger.fit_after_leaving(xi, a, big) is not None:
                continue
            room = min(book_a.inc_free + big.inc_mb, book_a.raw_free + big.raw_mb)
            room -= state.mem_rows[xi][a]
            if _pair_host(search, xi, a, big, room):
                return True
            if search.exhausted:
                return False
    return False


def _pair_host(search: _Search, xi: int, a: int, big: Placed, room: int) -> bool:
    """Find a host ``b`` where ``big`` fits once two new replicas leave it (both fitting in
    ``room`` MB on ``a``, unless the search is wide) and apply the trade; False (ledger
    unchanged) when none works."""
    state = search.state
    books = state.ledger.books
    big_id = state.profiles[big.mi].model_id
    present_a = books[a].present
    mems = state.mem_rows[big.mi]
    for b in state.cands[big.mi]:
        if search.step():
            return False
        book_b = books[b]
        if b == a or book_b.blocked or not book_b.eligible or big_id in book_b.present:
            continue
        need = mems[b]
        if not search.wide and min(book_b.inc_free, book_b.raw_free) + room < need:
            continue  # even the two largest replicas that fit ``a`` could not make room
        smalls = movables(state, b, largest_first=False)
        if not search.wide:
            smalls = [
                s
                for s in smalls
                if s.mi != xi
                and s.memory_mb <= room
                and a in search.cand_sets[s.mi]
                and state.profiles[s.mi].model_id not in present_a
            ]
        elif any(s.mi == xi for s in smalls):
            smalls = [s for s in smalls if s.mi != xi]
        for i, s1 in enumerate(smalls):
            for s2 in smalls[i + 1 :]:
                if not search.wide and s1.memory_mb + s2.memory_mb > room:
                    break  # sorted by size: every later partner is larger
                if search.step():
                    return False
                inc = book_b.inc_free + s1.inc_mb + s2.inc_mb
                if min(inc, book_b.raw_free + s1.raw_mb + s2.raw_mb) < need:
                    continue  # quick: the pair leaves too little for ``big``
                if _apply(search, xi, a, big, b, (s1, s2)):
                    return True
    return False


def _apply(
    search: _Search, xi: int, a: int, big: Placed, b: int, pair: tuple[Placed, Placed]
) -> bool:
    """Move ``big`` to ``b``, place ``xi`` on ``a`` and move ``pair`` to ``a`` (in a wide
    search a member that cannot join ``a`` may land elsewhere, :func:`_land_elsewhere`);
    undo and return False when a move does not fit or a moved model's domain spread would
    shrink."""
    state = search.state
    ledger = state.ledger
    before = {m: spread(state, m) for m in (big.mi, pair[0].mi, pair[1].mi)}
    ledger.remove(big.mi, a)
    for s in pair:
        ledger.remove(s.mi, b)
    done: list[tuple[int, int]] = []
    swapped: list[Placed] = []
    ok = True
    for m, h in ((big.mi, b), (xi, a), (pair[0].mi, a), (pair[1].mi, a)):
        if ledger.fit_new(m, h) is None and (h != a or m == xi or a in search.cand_sets[m]):
            ledger.place(m, h, "repair", state.score_now(m, h))
            done.append((m, h))
        elif not (
            search.wide
            and h == a
            and m != xi
            and _land_elsewhere(search, m, (a, b, xi), before, done, swapped)
        ):
            ok = False
            break
    if ok and all(spread(state, m) >= n for m, n in before.items()):
        return True
    for m, h in reversed(done):
        ledger.remove(m, h)
    for r in swapped:
        ledger.place(r.mi, r.hi, r.reason, r.score)
    for s in pair:
        ledger.place(s.mi, b, s.reason, s.score)
    ledger.place(big.mi, a, big.reason, big.score)
    return False


def _land_elsewhere(
    search: _Search,
    m: int,
    hosts: tuple[int, int, int],
    before: dict[int, int],
    done: list[tuple[int, int]],
    swapped: list[Placed],
) -> bool:
    """In a wide search, land the pair member ``m`` that cannot join ``a`` (``hosts`` is
    ``(a, b, xi)``) on its best host where it fits now, else in place of a third host's new
    replica that moves to ``a`` or ``b`` (:func:`_swap_in`); the moves go to ``done`` (the
    replica displaced also to ``swapped``). False (nothing moved) when neither works."""
    state = search.state
    found = state.best_host(m)
    if found is not None:
        state.ledger.place(m, found[0], "repair", found[1])
        done.append((m, found[0]))
        return True
    a, b, xi = hosts
    got = _swap_in(search, m, a, b, xi, before)
    if got is None:
        return False
    swapped.append(got[0])
    done += [(got[0].mi, got[2]), (m, got[1])]
    return True


def _swap_in(
    search: _Search, m: int, a: int, b: int, xi: int, before: dict[int, int]
) -> tuple[Placed, int, int] | None:
    """A host ``c`` (not ``a`` or ``b``) holding a new replica ``r`` whose departure lets
    ``m`` fit ``c`` and that fits ``a`` or ``b`` (as the trade leaves them) now: both moves
    applied (``m`` to ``c``, ``r`` to that host ``t``; ``r``'s spread before the move
    recorded in ``before``), returning ``(r, c, t)``; ``None`` (ledger unchanged) when there
    is none within the budget."""
    state = search.state
    ledger = state.ledger
    books = ledger.books
    # Where ``r`` could go: a host of the two with a model slot left, and its free memory.
    targets = [
        (t, min(books[t].inc_free, books[t].raw_free))
        for t in (a, b)
        if not books[t].max_models or len(books[t].present) < books[t].max_models
    ]
    if not targets:
        return None
    mid = state.profiles[m].model_id
    mems = state.mem_rows[m]
    dest: dict[int, int | None] = {}  # r's model -> its target (a and b do not change here)
    for c in state.cands[m]:
        if search.step():
            return None
        book_c = books[c]
        if c in (a, b) or book_c.blocked or not book_c.eligible or mid in book_c.present:
            continue
        leaving = movables(state, c, largest_first=False)
        if not leaving or min(book_c.inc_free, book_c.raw_free) + leaving[-1].memory_mb < mems[c]:
            continue  # even the largest replica there could not make room for ``m``
        for r in leaving:
            if r.mi in (xi, m):
                continue
            if min(book_c.inc_free + r.inc_mb, book_c.raw_free + r.raw_mb) < mems[c]:
                continue  # quick: too small to make room for ``m``
            if r.mi not in dest:
                dest[r.mi] = _destination(search, r, targets)
            t = dest[r.mi]
            if t is None or ledger.fit_after_leaving(m, c, r) is not None:
                continue
            spread_r = spread(state, r.mi)
            ledger.remove(r.mi, c)
            ledger.place(r.mi, t, "repair", state.score_now(r.mi, t))
            if ledger.fit_new(m, c) is None:
                ledger.place(m, c, "repair", state.score_now(m, c))
                before.setdefault(r.mi, spread_r)
                return r, c, t
            ledger.remove(r.mi, t)
            ledger.place(r.mi, c, r.reason, r.score)
    return None


def _destination(search: _Search, r: Placed, targets: list[tuple[int, int]]) -> int | None:
    """The first of ``targets`` (host, free MB; neither is ``r``'s own host) that is a
    candidate of ``r`` and where it fits now, or ``None``."""
    cands = search.cand_sets[r.mi]
    row = search.state.mem_rows[r.mi]
    for t, free in targets:
        # quick: a candidate with room (fit_new's memory test without the headroom) first
        if t in cands and row[t] <= free and search.state.ledger.fit_new(r.mi, t) is None:
            return t
    return None
