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
therefore first takes a host where it now fits directly, as a fair round would.

Only new replicas move (nothing live, no pin reservation or hold, no replica on a host that
holds its cached weights), so an exchange only ever adds the short model's replica: no class
places fewer. The planner runs it once, on the plan it keeps, for models still short
(highest priority first, one replica per model per round), within
:data:`EXCHANGE_BUDGET` host checks.
"""

from __future__ import annotations

from grid_core.planner.core import PlanState
from grid_core.planner.holds import FIXED_REASONS
from grid_core.planner.ledger import Placed
from grid_core.planner.phases import round_key

EXCHANGE_BUDGET = 6_000
"""Host pairs one plan's exchange repair may examine. On the 64x32 bench fleets at
occupancy 0 (seeds 1-50) no plan's exchange repair used more than 3,576 (5 ms of CPU), so
the budget binds only on larger or stranger fleets, where it caps the cost at a few ms."""

REPAIRABLE = frozenset({"memory", "slots"})
"""Fit failures a departing replica can cure."""


def exchange_rounds(state: PlanState) -> int:
    """Give short models one more replica per round by exchanges until none is found or the
    budget is spent; returns the replicas added."""
    short = sorted(
        (mi for mi in range(len(state.profiles)) if _short(state, mi)),
        key=lambda mi: round_key(state, mi),
    )
    cand_sets = [set(hs) for hs in state.cands]
    added = 0
    while short:
        still = []
        for mi in short:
            if state.exchange_steps >= EXCHANGE_BUDGET:
                return added
            if _exchange_one(state, mi, cand_sets):
                added += 1
                if _short(state, mi):
                    still.append(mi)
        short = still
    return added


def _short(state: PlanState, mi: int) -> bool:
    return bool(state.cands[mi]) and state.ledger.count[mi] < state.needed(mi)


def _movables(state: PlanState, hi: int, skip: int, largest_first: bool) -> list[Placed]:
    """New replicas on ``hi`` an exchange may move (not ``skip``'s), by size."""
    ledger = state.ledger
    out = [
        pl
        for pl in ledger.books[hi].models.values()
        if not pl.incumbent
        and pl.reason not in FIXED_REASONS
        and pl.mi != skip
        and not ledger.cached(pl.mi, hi)
    ]
    out.sort(key=lambda pl: (-pl.memory_mb if largest_first else pl.memory_mb, pl.mi))
    return out


def _exchange_one(state: PlanState, xi: int, cand_sets: list[set[int]]) -> bool:
    """Place one more replica of ``xi``, directly when an earlier exchange left room for it,
    otherwise by one exchange; True when placed."""
    ledger = state.ledger
    books = ledger.books
    xid = state.profiles[xi].model_id
    reasons = set(state.fail_reasons[xi])
    found = state.best_host(xi)
    state.fail_reasons[xi] = reasons  # a search is not a reason to report
    if found is not None:
        ledger.place(xi, found[0], "repair", found[1])
        return True
    for a in state.cands[xi]:
        book_a = books[a]
        if book_a.blocked or not book_a.eligible or xid in book_a.present:
            continue
        if book_a.max_models and len(book_a.present) >= book_a.max_models:
            continue  # x and the small replica both need a slot where one leaves
        if state.fit_reason(xi, a) not in REPAIRABLE:
            continue
        for big in _movables(state, a, xi, largest_first=True):
            if ledger.fit_after_leaving(xi, a, big) is not None:
                continue
            room = min(book_a.inc_free + big.inc_mb, book_a.raw_free + big.raw_mb)
            room -= state.mem_rows[xi][a]
            if _swap_host(state, xi, a, big, room, cand_sets) is not None:
                return True
            if state.exchange_steps >= EXCHANGE_BUDGET:
                return False
    return False


def _swap_host(
    state: PlanState, xi: int, a: int, big: Placed, room: int, cand_sets: list[set[int]]
) -> int | None:
    """Find a host ``b`` where ``big`` fits once a small new replica that fits in ``room``
    on ``a`` leaves, and apply the exchange; the host, or ``None`` (ledger unchanged)."""
    ledger = state.ledger
    books = ledger.books
    big_id = state.profiles[big.mi].model_id
    present_a = books[a].present
    for b in state.cands[big.mi]:
        state.exchange_steps += 1
        if state.exchange_steps > EXCHANGE_BUDGET:
            return None
        book_b = books[b]
        if b == a or book_b.blocked or not book_b.eligible or big_id in book_b.present:
            continue
        if min(book_b.inc_free, book_b.raw_free) + room < state.mem_rows[big.mi][b]:
            continue  # even the largest small replica that fits a could not make room
        for small in _movables(state, b, big.mi, largest_first=False):
            if small.memory_mb > room:
                break
            if (
                small.mi == xi
                or a not in cand_sets[small.mi]
                or state.profiles[small.mi].model_id in present_a
            ):
                continue
            if ledger.fit_after_leaving(big.mi, b, small) is not None:
                continue
            if _apply(state, xi, a, big, b, small):
                return b
    return None


def _apply(state: PlanState, xi: int, a: int, big: Placed, b: int, small: Placed) -> bool:
    """Move ``big`` to ``b`` and ``small`` to ``a`` and place ``xi`` on ``a``; undo and
    return False when a move does not fit or a moved model's domain spread would shrink."""
    ledger = state.ledger
    before = {m: _spread(state, m) for m in (big.mi, small.mi)}
    ledger.remove(big.mi, a)
    ledger.remove(small.mi, b)
    done: list[tuple[int, int]] = []
    for m, h in ((big.mi, b), (xi, a), (small.mi, a)):
        if ledger.fit_new(m, h) is not None:
            break
        domain_new = ledger.domain_list[h] not in ledger.domains[m]
        ledger.place(m, h, "repair", state.score(m, h, domain_new))
        done.append((m, h))
    if len(done) == 3 and all(_spread(state, m) >= n for m, n in before.items()):
        return True
    for m, h in reversed(done):
        ledger.remove(m, h)
    ledger.place(small.mi, b, small.reason, small.score)
    ledger.place(big.mi, a, big.reason, big.score)
    return False


def _spread(state: PlanState, mi: int) -> int:
    """Failure domains ``mi`` spans, counted up to what it requires."""
    return min(len(state.ledger.domains[mi]), state.required_domains(mi))
