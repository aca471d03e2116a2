"""Ejection chains: place a short model by moving several new replicas at once.

Source: specification, "Global placement loop": when greedy placement fragments capacity, a
deterministic bounded repair may evacuate and re-place several replicas. The one-move repair
(:mod:`grid_core.planner.repair`) frees a host by moving one new replica to a host where it
fits (or moving one more first). Some shortfalls need longer chains: a 21 GB model fits a
single-slot 22 GB GPU host only when the 8 GB CUDA model there moves to a six-slot server,
which has a free slot only when one of its GGUF replicas moves on to a Mac. This module finds
such chains with a breadth-first search, shortest chain first:

* a node is a replica that needs a home: the short model's new replica (the root) or a new
  replica displaced from the host the previous node's replica takes;
* the replica at a node either fits a host directly (the chain is complete), or fits a host
  once one new replica there leaves (that replica becomes the next node);
* a chain uses every host at most once, so its moves touch distinct hosts and each host's
  fit can be judged on the ledger as it stands; each placed replica is displaced at most
  once per search, and every search stops after :data:`CHAIN_SEARCH_BUDGET` host checks.

Only new replicas move: nothing live, no pin reservation and no replica on a host that
holds its cached weights (locality is never undone). A chain is applied only when every
displaced replica lands somewhere, so it only ever adds one replica, and no moved model's
failure-domain spread may fall below what it had (up to its requirement). Short models take
one chain each per round, in the class's round order, so scarce capacity found this way is
shared max-min fairly as the fair rounds share it.
"""

from __future__ import annotations

from dataclasses import dataclass

from grid_core.planner.core import PlanState
from grid_core.planner.holds import FIXED_REASONS
from grid_core.planner.ledger import Placed
from grid_core.planner.phases import round_key

MAX_CHAIN_MOVES = 4
"""Replicas one chain may place or move (the short model's replica plus three displaced
ones). On the oversubscribed 64-host bench fleets every chain found was at most three moves
long; four leaves a margin while keeping each search to a few hosts' worth of levels."""
CHAIN_SEARCH_BUDGET = 1_500
"""Host checks one search may spend before it gives up. On the fifteen 64x32 bench fleets
at occupancy 0, budgets of 4000 per search and 12000 per plan placed five more replicas in
all (2554 against 2549) for about 40 % more planning CPU; on a 1024-host fleet a search that
cannot succeed costs milliseconds, not a second."""
CHAIN_PLAN_BUDGET = 4_000
"""Host checks all searches of one plan may spend together: a few failing searches, so a
saturated fleet pays milliseconds for replicas it cannot place anyway."""

REPAIRABLE = frozenset({"memory", "slots"})
"""Fit failures one departing replica can cure (presence, blocking, colocation and disk are
left alone: a chain never frees disk or resolves an exclusion)."""


@dataclass(slots=True)
class ChainNode:
    """A replica that needs a home: model ``mi``, displaced from ``origin`` (its placement
    there is ``leaving``) so that the parent node's replica can land there; the root (the
    short model's new replica) has no origin."""

    mi: int
    origin: int | None
    leaving: Placed | None
    parent: int | None
    moves: int
    path: frozenset[int]
    """Hosts the chain up to here already uses: the origins of this node and its ancestors."""


def chain_rounds(state: PlanState, models: list[int]) -> None:
    """Give each short model of ``models`` one more replica per round via an ejection
    chain, until no short model finds one or the per-plan budget is spent."""
    short = sorted(
        (mi for mi in models if state.cands[mi] and state.ledger.count[mi] < state.needed(mi)),
        key=lambda mi: round_key(state, mi),
    )
    while short:
        if not _any_terminal(state):
            return
        still = []
        for mi in short:
            if state.chain_steps >= CHAIN_PLAN_BUDGET:
                return
            if place_by_chain(state, mi) and state.ledger.count[mi] < state.needed(mi):
                still.append(mi)
        short = still


def _any_terminal(state: PlanState) -> bool:
    """Whether some movable new replica fits another host as the ledger stands.

    Every chain ends with a displaced replica that fits somewhere directly; when none does,
    no search can succeed and all are skipped (a saturated fleet pays one scan per round).
    """
    ledger = state.ledger
    books = ledger.books
    seen: set[int] = set()
    for book in books:
        for pl in book.models.values():
            xi = pl.mi
            if pl.incumbent or pl.reason in FIXED_REASONS or xi in seen:
                continue
            seen.add(xi)
            mid = state.profiles[xi].model_id
            mems = state.mem_rows[xi]
            for hi in state.cands[xi]:
                b = books[hi]
                if (
                    b.inc_free >= mems[hi]
                    and b.raw_free >= mems[hi]
                    and mid not in b.present
                    and not (b.max_models and len(b.present) >= b.max_models)  # as fit_new
                    and ledger.fit_new(xi, hi) is None
                ):
                    return True
    return False


def place_by_chain(state: PlanState, mi: int) -> bool:
    """Place one more replica of ``mi`` by the shortest ejection chain found; True when placed.

    The ledger is unchanged when no chain is found (or the found one would reduce a moved
    model's failure-domain spread).
    """
    ledger = state.ledger
    books = ledger.books
    memo = state.displace_memo
    nodes = [ChainNode(mi, None, None, None, 1, frozenset())]
    displaced: set[tuple[int, int]] = set()
    """(model, host) placements already displaced in this search: each is tried once."""
    spent = 0
    head = 0
    limit = min(CHAIN_SEARCH_BUDGET, CHAIN_PLAN_BUDGET - state.chain_steps)
    while head < len(nodes) and spent < limit:
        k = head
        head += 1
        node = nodes[k]
        xi = node.mi
        mid = state.profiles[xi].model_id
        mems = state.mem_rows[xi]
        best: tuple[float, int] | None = None
        ejections: list[tuple[int, Placed]] = []
        domains = ledger.domains[xi]
        for hi in state.cands[xi]:
            spent += 1
            if hi in node.path:
                continue
            book = books[hi]
            if mid in book.present or book.blocked or not book.eligible:
                continue
            mem = mems[hi]
            if book.inc_free >= mem and book.raw_free >= mem:
                why = ledger.fit_new(xi, hi)
                if why is None:
                    s = state.score(xi, hi, ledger.domain_list[hi] not in domains)
                    if best is None or s > best[0]:
                        best = (s, hi)
                    continue
            else:
                why = "memory"
            if why in REPAIRABLE and node.moves < MAX_CHAIN_MOVES and best is None:
                got = memo.get((xi, hi))  # displaceable()'s memo, read without its call
                if got is not None and got[0] == book.version:
                    leaving = got[1]
                else:
                    leaving = displaceable(state, hi, xi)
                if leaving is not None and (leaving.mi, hi) not in displaced:
                    ejections.append((hi, leaving))
        if best is not None:
            state.chain_steps += spent
            return apply_chain(state, nodes, k, best[1])
        for hi, leaving in ejections:
            displaced.add((leaving.mi, hi))
            nodes.append(ChainNode(leaving.mi, hi, leaving, k, node.moves + 1, node.path | {hi}))
    state.chain_steps += spent
    return False


def displaceable(state: PlanState, hi: int, xi: int) -> Placed | None:
    """The smallest new replica on ``hi`` whose departure lets ``xi`` fit there, or ``None``.

    The answer depends only on ``hi``'s book, so it is remembered per host version: the
    searches of one plan ask about the same hosts again and again while nothing changed.
    """
    book = state.ledger.books[hi]
    got = state.displace_memo.get((xi, hi))
    if got is not None and got[0] == book.version:
        return got[1]
    best = _smallest_displaceable(state, hi, xi)
    state.displace_memo[(xi, hi)] = (book.version, best)
    return best


def _smallest_displaceable(state: PlanState, hi: int, xi: int) -> Placed | None:
    ledger = state.ledger
    book = ledger.books[hi]
    mem = state.mem_rows[xi][hi]
    # MB the leaving replica must release in each ledger (at least xi's own headroom share)
    inc_short = mem + ledger.headroom_extra(xi, hi) - book.inc_free
    raw_short = mem - book.raw_free
    best: Placed | None = None
    for pl in book.models.values():
        if (
            pl.incumbent
            or pl.inc_mb < inc_short
            or pl.raw_mb < raw_short
            or pl.reason in FIXED_REASONS
            or pl.mi == xi
            or (best is not None and (pl.memory_mb, pl.mi) >= (best.memory_mb, best.mi))
            or ledger.cached(pl.mi, hi)
        ):
            continue
        if ledger.fit_after_leaving(xi, hi, pl) is None:
            best = pl
    return best


def apply_chain(state: PlanState, nodes: list[ChainNode], last: int, dest: int) -> bool:
    """Carry out the chain ending with node ``last`` landing on ``dest``; undo it and
    return False when a moved model's failure-domain spread would shrink."""
    ledger = state.ledger
    steps: list[tuple[int, int, Placed | None]] = []
    """(model, host it lands on, the replica that leaves that host or ``None``)."""
    node = nodes[last]
    steps.append((node.mi, dest, None))
    while node.parent is not None:
        assert node.origin is not None and node.leaving is not None
        parent = nodes[node.parent]
        steps.append((parent.mi, node.origin, node.leaving))
        node = parent
    moved = {leaving.mi for _, _, leaving in steps if leaving is not None}
    before = {xi: _spread(state, xi) for xi in moved}
    # Displaced replicas leave their hosts first; every one then lands on its new host.
    for _, hi, leaving in steps:
        if leaving is not None:
            ledger.remove(leaving.mi, hi)
    for xi, hi, _ in steps:
        domain_new = ledger.domain_list[hi] not in ledger.domains[xi]
        ledger.place(xi, hi, "repair", state.score(xi, hi, domain_new))
    if all(_spread(state, xi) >= before[xi] for xi in moved):
        return True
    for xi, hi, leaving in reversed(steps):
        ledger.remove(xi, hi)
        if leaving is not None:
            ledger.place(leaving.mi, hi, leaving.reason, leaving.score)
    return False


def _spread(state: PlanState, xi: int) -> int:
    """Failure domains ``xi`` spans, counted up to what it requires."""
    return min(len(state.ledger.domains[xi]), state.required_domains(xi))
