"""Spare host: a complete plan leaves its most versatile host empty, not a specialised one.

Source: specification, "Global placement loop": placement computes each model's
future-compatible host set, and a flexible model is steered off a host a more constrained
model may need. The scarcity prices (:meth:`grid_core.planner.core.PlanState.prepare_scarcity`)
see only demand the plan still has to place, so when every model is placed they are silent
about *which* host the plan leaves empty. A fleet of one-model hosts then keeps, say, its
image/video-only media host empty while a new video replica takes a GPU host that every text
model could use; when coding later needs a second replica, every host it could use is taken.

On a finished plan that places every model's needed replicas and stages nothing, this pass
moves a new replica that is alone on its host onto an empty host when

* the move frees a host more of the catalogue could use: the host's *option value*
  (:func:`option_values`: the models one more replica of which would fit there, each
  weighted by how few hosts it would fit) is higher than the empty host's;
* the replica loses at most :data:`SPARE_SLACK` of its term score there: only best fit
  and hardware priors may be given up, never cached weights, a ready residency, a failure
  domain or measured speed;
* the replica serves no fewer requests at once there (:func:`_slots`: the host's declared
  concurrency caps the model's request slots): serving capacity is not a tie-break;
* it fits the ledger's hard rules and its model spans no fewer failure domains.

Only the host each new replica lands on changes: the plan places exactly the same replicas
(nothing live moves, no pin or hold, no replica on a host that has its cached weights), so no
model or priority class places fewer.
"""

from __future__ import annotations

from grid_core.planner.core import PlanState
from grid_core.planner.exchange import is_short
from grid_core.planner.holds import FIXED_REASONS
from grid_core.planner.ledger import Placed

SPARE_SLACK = 12.0
"""Most term score a new replica may give up to leave a more versatile host empty: the cold
tie-break terms, best fit (at most 10) and hardware priors (at most 2 at light demand), and
nothing of the ranked preferences above them (measured speed 40, a new failure domain 100,
cached weights 300, a ready residency 1000). The specification's future-compatible host
set outranks only the tie-breaks; at hot demand the hardware prior grows up to 8x, so a
materially faster host keeps its replica."""
MAX_SPARE_MOVES = 8
"""Moves one plan may make (each one fills an empty host and empties another)."""
SPARE_CHECK_BUDGET = 2_000
"""(empty host, replica) pairs one plan may examine, so a large fleet with many empty hosts
costs at most a few ms."""


def option_values(state: PlanState) -> list[float]:
    """Per host, how much of the catalogue could use it once its new replicas are gone: the
    sum over models a new replica of which would fit there then (:func:`_fits_bare`) of
    ``1 / (hosts where that model would fit so)``; a model with few such hosts needs each
    of them more (unitless, 0 for a host no model fits)."""
    rooms = [_bare_room(state, hi) for hi in range(len(state.hosts))]
    out = [0.0] * len(state.hosts)
    for mi, hs in enumerate(state.cands):
        fits = [hi for hi in hs if _fits_bare(state, mi, hi, rooms[hi])]
        if not fits:
            continue
        w = 1.0 / len(fits)
        for hi in fits:
            out[hi] += w
    return out


def _bare_room(state: PlanState, hi: int) -> tuple[int, int, int] | None:
    """(incremental MB, desired MB, model slots) free on ``hi`` without the plan's new
    replicas (slots: -1 for no ceiling), or ``None`` for a host no new work may use."""
    book = state.ledger.books[hi]
    if not book.eligible or book.blocked:
        return None
    inc, raw = book.inc_free, book.raw_free
    kept = set(book.live)
    for pl in book.models.values():
        if pl.incumbent:
            kept.add(state.profiles[pl.mi].model_id)
        else:
            inc += pl.inc_mb
            raw += pl.raw_mb
    slots = max(0, book.max_models - len(kept)) if book.max_models else -1
    return inc, raw, slots


def _fits_bare(state: PlanState, mi: int, hi: int, room: tuple[int, int, int] | None) -> bool:
    """Whether one new replica of ``mi`` fits ``hi``'s ``room`` (:func:`_bare_room`):
    memory with its admission headroom and a model slot (disk and colocation aside)."""
    if room is None:
        return False
    inc, raw, slots = room
    if slots == 0:
        return False
    ledger = state.ledger
    mem = state.mem_rows[mi][hi]
    return inc >= mem + ledger.headroom_extra(mi, hi) and raw >= mem


def keep_spare(state: PlanState) -> int:
    """Move new replicas so the plan's empty hosts are the least versatile ones it can
    leave (see the module docstring); returns the moves made. The plan must be finished,
    with nothing staged; a plan with any model short is left unchanged."""
    if state.evictions or state.relocations or state.staged:
        return 0
    if any(is_short(state, mi) for mi in range(len(state.profiles))):
        return 0
    empty = [hi for hi in range(len(state.hosts)) if _spare(state, hi)]
    if not empty:
        return 0
    values = option_values(state)
    cand_sets = [set(hs) for hs in state.cands]
    moves = 0
    checks = [0]
    while moves < MAX_SPARE_MOVES:
        best = _best_move(state, empty, values, cand_sets, checks)
        if best is None:
            break
        pl, to = best
        _move(state, pl, to)
        empty.remove(to)
        empty.append(pl.hi)
        moves += 1
    return moves


def _spare(state: PlanState, hi: int) -> bool:
    """Whether ``hi`` is wholly empty: eligible, untouched, nothing live or planned there."""
    book = state.ledger.books[hi]
    return (
        book.eligible
        and not book.blocked
        and not book.models
        and not book.live
        and not book.staged
        and not state.hosts[hi].residencies
    )


def _movable(state: PlanState, hi: int) -> Placed | None:
    """The new replica alone on an otherwise empty host ``hi`` that may move, or ``None``."""
    book = state.ledger.books[hi]
    if len(book.models) != 1 or book.live or book.staged or state.hosts[hi].residencies:
        return None
    (pl,) = book.models.values()
    if pl.incumbent or pl.reason in FIXED_REASONS or state.ledger.cached(pl.mi, hi):
        return None
    return pl


def _best_move(
    state: PlanState,
    empty: list[int],
    values: list[float],
    cand_sets: list[set[int]],
    checks: list[int],
) -> tuple[Placed, int] | None:
    """The move with the largest option-value gain (then the least score lost, then the
    lowest model, source and target index) within the slack, or ``None``. ``values`` are
    :func:`option_values`, ``cand_sets`` each model's candidate hosts and ``checks[0]`` the
    pairs examined so far (counted against :data:`SPARE_CHECK_BUDGET`)."""
    best: tuple[float, float, int, int, int] | None = None
    found: tuple[Placed, int] | None = None
    for src in range(len(state.hosts)):
        pl = _movable(state, src)
        if pl is None:
            continue
        for to in empty:
            gain = values[src] - values[to]
            if gain <= 0.0 or to not in cand_sets[pl.mi]:
                continue
            checks[0] += 1
            if checks[0] > SPARE_CHECK_BUDGET:
                return found
            if _slots(state, pl.mi, to) < _slots(state, pl.mi, src):
                continue
            lost = _loss(state, pl, to)
            if lost is None or lost > SPARE_SLACK:
                continue
            key = (-gain, lost, pl.mi, src, to)
            if best is None or key < best:
                best, found = key, (pl, to)
    return found


def _slots(state: PlanState, mi: int, hi: int) -> int:
    """Requests one replica of ``mi`` can serve at once on ``hi``: its own request slots,
    capped by the host's declared concurrency (not capped when the host declares none)."""
    own = state.profiles[mi].replica_concurrency
    cap = state.hosts[hi].concurrency
    return own if not cap or cap > own else cap


def _loss(state: PlanState, pl: Placed, to: int) -> float | None:
    """Term score ``pl``'s replica gives up by moving to ``to`` (``None``: it does not fit
    there, or its model would span fewer failure domains); the ledger is left unchanged.
    Terms only: the planner's packing prices speak for demand still to place, and a plan
    this pass runs on has none."""
    ledger = state.ledger
    mi, src = pl.mi, pl.hi
    before = min(len(ledger.domains[mi]), state.required_domains(mi))
    ledger.remove(mi, src)
    try:
        if ledger.fit_new(mi, to) is not None:
            return None
        domains = ledger.domains[mi]
        dom_to = ledger.domain_list[to]
        after = len(domains) + (dom_to not in domains)
        if min(after, state.required_domains(mi)) < before:
            return None
        here = state._terms_now(mi, src, ledger.domain_list[src] not in domains)
        there = state._terms_now(mi, to, dom_to not in domains)
        return here - there
    finally:
        ledger.place(mi, src, pl.reason, pl.score)


def _move(state: PlanState, pl: Placed, to: int) -> None:
    """Apply the move (checked by :func:`_loss`)."""
    ledger = state.ledger
    ledger.remove(pl.mi, pl.hi)
    domain_new = ledger.domain_list[to] not in ledger.domains[pl.mi]
    ledger.place(pl.mi, to, pl.reason, state.score(pl.mi, to, domain_new))
