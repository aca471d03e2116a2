"""Exchange repair: place a short model by swapping a large and a small new replica.

Source: specification, "Global placement loop": a deterministic bounded repair may evacuate
and re-place replicas when greedy placement fragments capacity. The one-move repair and the
ejection chains (:mod:`grid_core.planner.repair`, :mod:`grid_core.planner.chains`) judge
every move on the ledger as it stands and use each host once, so they never close a cycle.
The packing an optimum finds on slot-bound fleets often needs exactly one: a large replica
sits on a host without a model ceiling (or with slots to spare) and fills its memory, while
a server whose slots are all taken by small replicas has memory to spare. Moving the large
replica to that server in place of one small replica, and the small one to where the large
one was, leaves room there for the short model as well:

* host ``a`` (a candidate of the short model ``x``, which does not fit there) holds a new
  replica ``big`` whose departure lets ``x`` fit, and ``a`` keeps a model slot for a second
  newcomer (no ceiling, or a free slot);
* host ``b`` holds a new replica ``small`` whose departure lets ``big`` fit there, and
  ``small`` fits on ``a`` beside ``x`` once ``big`` has left;
* the three moves are applied together and kept only when every one fits the ledger's hard
  rules and neither moved model spans fewer failure domains than before (up to what it
  requires); otherwise the ledger is restored exactly.

An exchange can leave memory to spare where the large replica was; each model's turn
therefore first takes a host where it now fits directly, as a fair round would. Rounds go
on while any model gains a replica. When a round finds nothing, one more round may *bump*:
the short model takes a host from a small new replica there (one whose model has a host
with a slot to spare elsewhere, and whose failure-domain spread cannot shrink by moving),
and that replica then lands directly or by an exchange that never moves the short model's
new replica; otherwise both are put back.

Only new replicas move (nothing live, no pin reservation or hold, no replica on a host that
holds its cached weights), so an exchange only ever adds the short model's replica: no class
places fewer. The planner runs it once, on the plan it keeps, for models still short
(highest priority first, one replica per model per round), within
:data:`EXCHANGE_BUDGET` host checks and :data:`BUMP_BUDGET` bump trials.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from grid_core.planner.chains import REPAIRABLE
from grid_core.planner.core import PlanState
from grid_core.planner.holds import FIXED_REASONS
from grid_core.planner.ledger import Placed
from grid_core.planner.phases import round_key

EXCHANGE_BUDGET = 3_000
"""Host pairs one plan's exchange repair may examine. On the 64x32 bench fleets at
occupancy 0 (seeds 1-50) 3,000 place 8,528 replicas in all and 6,000 place 8,533, but a
fleet where nothing more fits spends the whole budget: 3 ms of CPU at 3,000 on seed 1
against 7 ms at 6,000 (the planner's whole budget there is about 40 ms)."""
BUMP_BUDGET = 50
"""Bump trials (a short model takes a small replica's host, the small replica then lands
directly or by an exchange) one plan may make; each costs a host search. On the 64x32
bench fleets at occupancy 0 (seeds 1-50, exchange budget 3,000) no bumps place 8,515
replicas in all, 50 trials 8,528, 200 trials 8,529."""


def exchange_rounds(state: PlanState) -> int:
    """Give short models one more replica per round by exchanges until none is found or the
    budget is spent; returns the replicas added."""
    short = short_by_round(state)
    cand_sets = [set(hs) for hs in state.cands]
    added = 0
    bump = False
    while short:
        progress = False
        for mi in short:
            if state.exchange_steps >= EXCHANGE_BUDGET:
                return added
            if _exchange_one(state, mi, cand_sets, bump):
                added += 1
                progress = True
        short = [mi for mi in short if is_short(state, mi)]
        if not progress and bump:
            break
        bump = not progress  # bump only once plain exchanges find nothing more
    return added


def is_short(state: PlanState, mi: int) -> bool:
    return bool(state.cands[mi]) and state.ledger.count[mi] < state.needed(mi)


def short_by_round(state: PlanState) -> list[int]:
    """Indexes of the models still short (:func:`is_short`) in fair-round order, highest
    priority first (:func:`~grid_core.planner.phases.round_key`): the order in which the
    repairs run on the finished plan give them one replica per round."""
    return sorted(
        (mi for mi in range(len(state.profiles)) if is_short(state, mi)),
        key=lambda mi: round_key(state, mi),
    )


def movables(state: PlanState, hi: int, largest_first: bool) -> Sequence[Placed]:
    """Every new replica on ``hi`` a repair may move (not live, no pin reservation or hold,
    not on a host holding its cached weights), by memory (MB; the largest first with
    ``largest_first``, else the smallest), then model index: the remembered list itself,
    per host version (read it, never change it).

    A repair asks about a host for a model that is not there yet (:func:`open_candidates`),
    so none of these is a replica of the model it places."""
    book = state.ledger.books[hi]
    key = (hi, largest_first)
    got = state.movable_memo.get(key)
    if got is None or got[0] != book.version:  # the list changes only with the host
        got = (book.version, _movable_list(state, hi, largest_first))
        state.movable_memo[key] = got
    return got[1]


def _movable_list(state: PlanState, hi: int, largest_first: bool) -> list[Placed]:
    ledger = state.ledger
    out = [
        pl
        for pl in ledger.books[hi].models.values()
        if not pl.incumbent and pl.reason not in FIXED_REASONS and not ledger.cached(pl.mi, hi)
    ]
    out.sort(key=lambda pl: (-pl.memory_mb if largest_first else pl.memory_mb, pl.mi))
    return out


def _exchange_one(state: PlanState, xi: int, cand_sets: list[set[int]], bump: bool = False) -> bool:
    """Place one more replica of ``xi``: directly when an earlier exchange left room for it,
    else by one exchange, else (``bump``) by taking a host from a small replica that then
    lands directly or by an exchange; True when placed."""
    if place_direct(state, xi) or _exchange(state, xi, cand_sets, frozenset()):
        return True
    return bump and _bumped(state, xi, cand_sets)


def place_direct(state: PlanState, xi: int) -> bool:
    """Place ``xi`` on its best host where it fits now, if any."""
    found = state.best_host(xi)
    if found is None:
        return False
    state.ledger.place(xi, found[0], "repair", found[1])
    return True


def land_short(state: PlanState, at_most: int | None = None) -> int:
    """Let the short models (of priority ``at_most`` and below, or all) land directly where
    they fit (:func:`place_direct`), in round order, one replica each per round, while any
    lands; returns the replicas placed. The last step of a trade that freed room."""
    placed = 0
    while True:
        before = placed
        for mi in short_by_round(state):
            if at_most is None or state.profiles[mi].priority <= at_most:
                placed += place_direct(state, mi)
        if placed == before:
            return placed


def open_candidates(state: PlanState, mi: int) -> Iterator[int]:
    """``mi``'s candidate hosts (host indexes, in candidate order) that a repair may still
    give one more new replica of it: open to repair moves (not blocked), eligible, and not
    holding ``mi`` already (no replica of it placed, desired or live there). Checked as each
    host is reached, so moves made for earlier hosts count. Every repair search starts here
    (:func:`repairable_hosts`, :mod:`grid_core.planner.settle`,
    :mod:`grid_core.planner.longchains`)."""
    books = state.ledger.books
    mid = state.profiles[mi].model_id
    for hi in state.cands[mi]:
        book = books[hi]
        if book.blocked or not book.eligible or mid in book.present:
            continue
        yield hi


def repairable_hosts(state: PlanState, xi: int, *, slot_free: bool) -> Iterator[int]:
    """``xi``'s candidate hosts, in order, where a repair move could place it: the
    :func:`open_candidates` short for a repairable reason (memory, slots), and with
    ``slot_free`` also below their model ceiling. Checked as each host is reached, so moves
    made for earlier hosts count."""
    books = state.ledger.books
    for a in open_candidates(state, xi):
        book = books[a]
        if slot_free and book.max_models and len(book.present) >= book.max_models:
            continue
        if state.fit_reason(xi, a) not in REPAIRABLE:
            continue
        yield a


def _exchange(state: PlanState, xi: int, cand_sets: list[set[int]], avoid: frozenset[int]) -> bool:
    """Place ``xi`` by one exchange that moves no replica of ``avoid``; True when placed."""
    ledger = state.ledger
    # x and the small replica both need a slot where one leaves: a host with a free slot.
    for a in repairable_hosts(state, xi, slot_free=True):
        book_a = ledger.books[a]
        for big in movables(state, a, largest_first=True):
            if big.mi in avoid or ledger.fit_after_leaving(xi, a, big) is not None:
                continue
            room = min(book_a.inc_free + big.inc_mb, book_a.raw_free + big.raw_mb)
            room -= state.mem_rows[xi][a]
            if _swap_host(state, xi, a, big, room, cand_sets, avoid) is not None:
                return True
            if state.exchange_steps >= EXCHANGE_BUDGET:
                return False
    return False


def _bumped(state: PlanState, xi: int, cand_sets: list[set[int]]) -> bool:
    """Place ``xi`` in place of a small new replica that then lands directly or by an
    exchange (never moving ``xi``); the ledger is unchanged when none works."""
    ledger = state.ledger
    for a in repairable_hosts(state, xi, slot_free=False):
        for small in movables(state, a, largest_first=False):
            if ledger.fit_after_leaving(xi, a, small) is not None or _pinned_spread(
                state, small.mi, a
            ):
                continue
            if not _has_open_host(state, small.mi, a):
                continue
            state.bump_trials += 1
            if state.bump_trials > BUMP_BUDGET:
                return False
            ledger.remove(small.mi, a)
            ledger.place(xi, a, "repair", state.score(xi, a, True))
            if place_direct(state, small.mi) or _exchange(
                state, small.mi, cand_sets, frozenset({xi})
            ):
                return True
            ledger.remove(xi, a)
            ledger.place(small.mi, a, small.reason, small.score)
    return False


def _swap_host(
    state: PlanState,
    xi: int,
    a: int,
    big: Placed,
    room: int,
    cand_sets: list[set[int]],
    avoid: frozenset[int],
) -> int | None:
    """Find a host ``b`` where ``big`` fits once a small new replica that fits in ``room``
    on ``a`` leaves, and apply the exchange; the host, or ``None`` (ledger unchanged)."""
    ledger = state.ledger
    books = ledger.books
    big_id = state.profiles[big.mi].model_id
    present_a = books[a].present
    mems = state.mem_rows[big.mi]
    for b in state.cands[big.mi]:
        state.exchange_steps += 1
        if state.exchange_steps > EXCHANGE_BUDGET:
            return None
        book_b = books[b]
        if b == a or book_b.blocked or not book_b.eligible or big_id in book_b.present:
            continue
        need = mems[b]
        if min(book_b.inc_free, book_b.raw_free) + room < need:
            continue  # even the largest small replica that fits a could not make room
        for small in movables(state, b, largest_first=False):
            if small.memory_mb > room:
                break
            if (
                small.mi == xi
                or small.mi in avoid
                or a not in cand_sets[small.mi]
                or state.profiles[small.mi].model_id in present_a
            ):
                continue
            if min(book_b.inc_free + small.inc_mb, book_b.raw_free + small.raw_mb) < need:
                continue  # quick: too small to make room for ``big`` (fit_after_leaving's
                # memory test, without the headroom share)
            if ledger.fit_after_leaving(big.mi, b, small) is not None:
                continue
            if _apply(state, xi, a, big, b, small):
                return b
    return None


def _apply(state: PlanState, xi: int, a: int, big: Placed, b: int, small: Placed) -> bool:
    """Move ``big`` to ``b`` and ``small`` to ``a`` and place ``xi`` on ``a``; undo and
    return False when a move does not fit or a moved model's domain spread would shrink."""
    ledger = state.ledger
    before = {m: spread(state, m) for m in (big.mi, small.mi)}
    ledger.remove(big.mi, a)
    ledger.remove(small.mi, b)
    done: list[tuple[int, int]] = []
    for m, h in ((big.mi, b), (xi, a), (small.mi, a)):
        if ledger.fit_new(m, h) is not None:
            break
        domain_new = ledger.domain_list[h] not in ledger.domains[m]
        ledger.place(m, h, "repair", state.score(m, h, domain_new))
        done.append((m, h))
    if len(done) == 3 and all(spread(state, m) >= n for m, n in before.items()):
        return True
    for m, h in reversed(done):
        ledger.remove(m, h)
    ledger.place(small.mi, b, small.reason, small.score)
    ledger.place(big.mi, a, big.reason, big.score)
    return False


def _has_open_host(state: PlanState, mi: int, skip: int) -> bool:
    """Whether ``mi`` has a candidate host other than ``skip`` with a model slot to spare
    (no ceiling, or a free slot): without one it can land neither directly on a slot-bound
    fleet nor by an exchange, so bumping it is not worth a search."""
    books = state.ledger.books
    for h in state.cands[mi]:
        b = books[h]
        if h != skip and b.eligible and (not b.max_models or len(b.present) < b.max_models):
            return True
    return False


def _pinned_spread(state: PlanState, mi: int, hi: int) -> bool:
    """Whether moving ``mi``'s replica off ``hi`` could make it span fewer failure domains
    than before (counted up to what it requires), wherever it lands."""
    domains = state.ledger.domains[mi]
    dom = state.ledger.domain_list[hi]
    return domains.get(dom, 0) == 1 and len(domains) <= state.required_domains(mi)


def spread(state: PlanState, mi: int) -> int:
    """Failure domains ``mi`` spans, counted up to what it requires."""
    return min(len(state.ledger.domains[mi]), state.required_domains(mi))


def spread_kept(state: PlanState, mi: int, before: int) -> bool:
    """Whether ``mi``, having lost replicas to a trade, still spans the ``before`` failure
    domains it did (:func:`spread`) or as many as its remaining replicas can: a model's
    failure-domain minimum is a hard rule where its replicas can meet it, so a trade may cut
    its spread only as far as it cuts its count."""
    left = state.ledger.count[mi]
    return spread(state, mi) >= (before if before < left else left)
