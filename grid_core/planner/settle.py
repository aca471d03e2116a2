"""Settling repair: the planner's last search for replicas still short, on a budget of its own.

Source: specification, "Global placement loop": a deterministic bounded repair may evacuate
and re-place replicas when greedy placement fragments capacity. The one-move repair, the
ejection chains and the exchange repair (:mod:`grid_core.planner.repair`,
:mod:`grid_core.planner.chains`, :mod:`grid_core.planner.exchange`) share per-plan budgets
that the higher priority classes spend first; on oversubscribed fleets the lowest class is
left short where a few moves of new replicas would place it. This pass runs once, on the
plan kept, after the exchanges, for the models still short (highest priority first, one
replica per model per round), within :data:`SETTLE_CHAIN_BUDGET` host checks.

It searches ejection chains as :mod:`grid_core.planner.chains` does (the short model takes
a host a new replica leaves, that replica takes another host, and so on, up to
:data:`~grid_core.planner.chains.MAX_CHAIN_MOVES` moves, the last one landing where it fits
directly), but over a map of moves shared by all searches while the ledger stands
(:class:`_Chains`), so a search reaches the full depth within a small budget. Two moves the
chains module does not make:

* at a host a replica may leave, the largest new replica whose departure makes room is
  tried as well as the smallest;
* a displaced replica may land on a host an earlier move of the same chain changed, when
  the replica that left there made room for its newcomer and this one too (a large replica
  leaves, two smaller arrive: the cycle :mod:`grid_core.planner.exchange` looks for).

Only new replicas move (nothing live, no pin reservation or hold, no replica on a host that
holds its cached weights), every move obeys the ledger's hard rules, and no moved model may
span fewer failure domains than before (up to what it requires): the pass only ever adds a
replica, so no class places fewer.

Measured on the 64x32 bench fleets at occupancy 0, seeds 1-50 (exact ordered optimum
8,638): 8,544 replicas without this pass; 8,559 with chains over the shared map, 8,561
trying the largest leaving replica too, 8,562 with the closing landings as well. A first
pass of one-move shifts before the chains placed one replica more (seed 35) for 0.5 ms more
on seed 1, so it was left out.
"""

from __future__ import annotations

from collections.abc import Iterator

from grid_core.planner.chains import (
    MAX_CHAIN_MOVES,
    REPAIRABLE,
    ChainNode,
    apply_chain,
    displaceable,
)
from grid_core.planner.core import PlanState
from grid_core.planner.exchange import is_short, movables, open_candidates, short_by_round, spread
from grid_core.planner.holds import FIXED_REASONS
from grid_core.planner.ledger import Placed

SETTLE_CHAIN_BUDGET = 8_000
"""Host checks the searches of one plan may spend together (finding where models fit
counts too). On the 64x32 bench fleets at occupancy 0, seeds 1-50, 2,000 place 8,555
replicas, 4,000 8,562, 8,000 8,565 (unbounded, a plan spent at most 9,195); on the held-out
seeds 51-80, 4,000 and 8,000 both place 4,861. Raised from 4,000 once the lower-class-aware
candidate ran its own settling to the end (``PlanState.finish_lowest``): with it, seeds 1-50
place 8,574 at 4,000 and 8,577 at 8,000, seeds 51-80 4,866 / 4,868, seeds 81-110 5,054 /
5,055, no plan fewer in any class; 64x32 s1 and s2 o0 take no longer (their searches stop
early). About 1 ms of CPU on 64x32 seed 2, whose one search fails."""


def closing_room(state: PlanState, leaving: Placed, arrived: int, mid: str, need_mb: int) -> bool:
    """Whether the host the replica ``leaving`` left also takes one replica of model ``mid``
    (``need_mb`` there) beside the replica of model index ``arrived`` that took its place: no
    copy of ``mid`` there, a free model slot, and room for both arrivals in the tighter
    ledger (the closing landing of a chain on a host it already changed)."""
    p = leaving.hi
    book = state.ledger.books[p]
    return (
        mid not in book.present
        and not (book.max_models and len(book.present) >= book.max_models)
        and min(book.inc_free, book.raw_free) + leaving.memory_mb
        >= state.mem_rows[arrived][p] + need_mb
    )


def settle(state: PlanState) -> int:
    """Place what is still short by ejection chains; returns the replicas added. Leaves
    where each model fits now in ``state.fit_map`` for the long chains that may follow."""
    chains = _Chains(state)
    added = chains.rounds(SETTLE_CHAIN_BUDGET)
    versions = tuple(book.version for book in state.ledger.books)
    state.fit_map = (versions, chains.fits, chains.ends)
    return added


def fit_hosts(state: PlanState, mi: int) -> list[int]:
    """Candidate hosts where one more new replica of ``mi`` fits now by every hard rule, in
    candidate order."""
    ledger = state.ledger
    books = ledger.books
    mid = state.profiles[mi].model_id
    mems = state.mem_rows[mi]
    out: list[int] = []
    for hi in state.cands[mi]:
        b = books[hi]
        mem = mems[hi]
        if (
            b.inc_free >= mem
            and b.raw_free >= mem
            and not (b.max_models and len(b.present) >= b.max_models)
            and mid not in b.present
            and ledger.fit_new(mi, hi) is None
        ):
            out.append(hi)
    return out


class _Chains:
    """Ejection chains over a map of moves shared by every search while the ledger stands.

    The map holds, per model, the hosts where it fits directly and the (host, replica
    leaving) pairs whose departure lets it fit there, each found when first needed; a failed
    search leaves the ledger as it was, so the next short model reuses it, and a placed
    chain clears it. Breadth first, each model enters a search once, at the shortest depth
    it is reached (never the short model itself): where it came from changes only which
    hosts it may not reuse. A chain that does not close on a host it changed ends with a
    displaced replica that fits a host directly, so the models that fit somewhere now (the
    *ends*) are found first: at the last depth only a replica of an end is displaced, and
    while there is no end and no room for the short model itself no search is made (a
    saturated fleet's cheap exit, which also forgoes the rarer closing chains).
    """

    def __init__(self, state: PlanState) -> None:
        self.state = state
        self.spent = 0
        self.fits: dict[int, list[int]] = {}
        self.ejections: dict[tuple[int, bool], list[tuple[int, Placed]]] = {}
        self.ends: set[int] | None = None
        self.movable: list[int] | None = None
        self.cand_sets: dict[int, set[int]] = {}

    def _changed(self) -> None:
        self.fits.clear()
        self.ejections.clear()
        self.ends = None
        self.movable = None

    def _fits(self, mi: int) -> list[int]:
        got = self.fits.get(mi)
        if got is None:
            self.spent += len(self.state.cands[mi])
            got = self.fits[mi] = fit_hosts(self.state, mi)
        return got

    def _movable(self) -> list[int]:
        """Indexes of the models with a new replica that may move (not live, no pin
        reservation or hold), ascending; remembered while the ledger stands."""
        if self.movable is None:
            self.movable = sorted(
                {
                    pl.mi
                    for book in self.state.ledger.books
                    for pl in book.models.values()
                    if not pl.incumbent and pl.reason not in FIXED_REASONS
                }
            )
        return self.movable

    def _ends(self) -> set[int]:
        """Models with a new replica that may move and a host where one more fits now."""
        if self.ends is None:
            self.ends = {mi for mi in self._movable() if self._fits(mi)}
        return self.ends

    def _ejections(self, mi: int, last: bool) -> list[tuple[int, Placed]]:
        """(host, new replica whose departure lets ``mi`` fit there): per host the smallest
        such replica and the largest when it differs; with ``last`` only the smallest
        replica of an end."""
        got = self.ejections.get((mi, last))
        if got is not None:
            return got
        state = self.state
        books = state.ledger.books
        ends = self._ends() if last else None
        got = []
        for hi in open_candidates(state, mi):
            book = books[hi]
            if ends is not None and not any(pl.mi in ends for pl in book.models.values()):
                continue
            self.spent += 1
            if state.fit_reason(mi, hi) not in REPAIRABLE:
                continue
            if ends is not None:
                got.extend((hi, pl) for pl in self._end_leaving(mi, hi, ends))
                continue
            small = displaceable(state, hi, mi)
            if small is None:
                continue
            got.append((hi, small))
            big = movables(state, hi, largest_first=True)[0]
            if (
                big.memory_mb > small.memory_mb
                and state.ledger.fit_after_leaving(mi, hi, big) is None
            ):
                got.append((hi, big))
        self.ejections[(mi, last)] = got
        return got

    def _end_leaving(self, mi: int, hi: int, ends: set[int]) -> list[Placed]:
        """The smallest replica of an end on ``hi`` whose departure lets ``mi`` fit there."""
        ledger = self.state.ledger
        for pl in movables(self.state, hi, largest_first=False):
            if pl.mi in ends and ledger.fit_after_leaving(mi, hi, pl) is None:
                return [pl]
        return []

    def rounds(self, budget: int) -> int:
        """Give each short model (:func:`~grid_core.planner.exchange.short_by_round`) one more
        replica per round by :meth:`place`, while a round places any and fewer than
        ``budget`` steps are spent; returns the replicas added."""
        state = self.state
        short = short_by_round(state)
        added = 0
        while short:
            still = []
            for mi in short:
                if self.spent >= budget:
                    return added
                if self.place(mi):
                    added += 1
                    if is_short(state, mi):
                        still.append(mi)
            short = still
        return added

    def place(self, mi: int) -> bool:
        """Place one more replica of ``mi`` by the shortest chain found; True when placed."""
        if not self._ends() and not self._fits(mi):
            return False
        nodes = [ChainNode(mi, None, None, None, 1, frozenset())]
        seen = {mi}
        head = 0
        while head < len(nodes) and self.spent < SETTLE_CHAIN_BUDGET:
            k = head
            head += 1
            node = nodes[k]
            ended = self._end(nodes, k)
            if ended is not None:
                return ended
            if node.parent is not None and self._close(nodes, k):
                return True
            if node.moves >= MAX_CHAIN_MOVES:
                continue
            last = node.moves + 1 == MAX_CHAIN_MOVES
            for hi, leaving in self._ejections(node.mi, last):
                if hi in node.path or leaving.mi in seen:
                    continue
                if last and not any(h not in node.path and h != hi for h in self._fits(leaving.mi)):
                    continue
                seen.add(leaving.mi)
                nodes.append(
                    ChainNode(leaving.mi, hi, leaving, k, node.moves + 1, node.path | {hi})
                )
        return False

    def _end(self, nodes: list[ChainNode], k: int) -> bool | None:
        """End the chain with node ``k``'s replica on its best-scored host where it fits
        directly, outside the chain's path, that keeps every moved model's failure domains
        (:func:`_keeps_spread`): ``None`` when there is none (the ledger untouched), else
        whether :func:`~grid_core.planner.chains.apply_chain` kept the chain."""
        state = self.state
        xi = nodes[k].mi
        path = nodes[k].path
        open_hosts = [hi for hi in self._fits(xi) if hi not in path]
        open_hosts.sort(key=lambda hi: (-state.score_now(xi, hi), hi))
        for dest in open_hosts:
            if _keeps_spread(state, nodes, k, dest):
                self._changed()
                return apply_chain(state, nodes, k, dest)
        return None

    def _close(self, nodes: list[ChainNode], k: int) -> bool:
        """Land node ``k``'s replica on a host an ancestor's move changed (not its own
        origin), where the replica that left made room for the newcomer and this one too;
        True when applied."""
        state = self.state
        node = nodes[k]
        if node.parent is None:
            return False
        for p in self._closing_hosts(nodes, node.parent, node.mi):
            if _keeps_spread(state, nodes, k, p) and _apply_closing(state, nodes, k, p):
                self._changed()
                return True
        return False

    def _closing_hosts(self, nodes: list[ChainNode], k: int, xi: int) -> Iterator[int]:
        """The origins of node ``k`` and of its ancestors (host indexes, node ``k``'s first:
        hosts where a move of the chain replaced a replica) where one replica of ``xi``
        could land beside the newcomer by presence, memory and slots (:func:`closing_room`;
        the ledger's hard rules are checked when the chain is applied). One step is spent
        per host examined; a host is judged as the ledger stands when it is reached."""
        state = self.state
        mems = state.mem_rows[xi]
        mid = state.profiles[xi].model_id
        cands = self.cand_sets.get(xi)
        if cands is None:
            cands = self.cand_sets[xi] = set(state.cands[xi])
        anc = nodes[k]
        while anc.leaving is not None and anc.parent is not None:
            self.spent += 1
            p = anc.leaving.hi
            if p in cands and closing_room(state, anc.leaving, nodes[anc.parent].mi, mid, mems[p]):
                yield p
            anc = nodes[anc.parent]


def _apply_closing(state: PlanState, nodes: list[ChainNode], last: int, dest: int) -> bool:
    """Carry out the chain ending with node ``last`` landing on ``dest``, a host an earlier
    move of the chain changed: every other move first, then the last replica only when it
    fits ``dest`` by the ledger's hard rules, kept only when no moved model then spans fewer
    failure domains than before (up to what it requires; a long chain may displace two
    replicas of one model, which :func:`_keeps_spread` judges one at a time); otherwise the
    ledger is restored exactly."""
    ledger = state.ledger
    steps: list[tuple[int, int, Placed]] = []
    node = nodes[last]
    while node.parent is not None:
        assert node.origin is not None and node.leaving is not None
        steps.append((nodes[node.parent].mi, node.origin, node.leaving))
        node = nodes[node.parent]
    before = {leaving.mi: spread(state, leaving.mi) for _, _, leaving in steps}
    for _, hi, leaving in steps:
        ledger.remove(leaving.mi, hi)
    for xi, hi, _ in steps:
        ledger.place(xi, hi, "repair", state.score_now(xi, hi))
    xi = nodes[last].mi
    if ledger.fit_new(xi, dest) is None:
        ledger.place(xi, dest, "repair", state.score_now(xi, dest))
        if all(spread(state, m) >= n for m, n in before.items()):
            return True
        ledger.remove(xi, dest)
    for xi, hi, leaving in reversed(steps):
        ledger.remove(xi, hi)
        ledger.place(leaving.mi, hi, leaving.reason, leaving.score)
    return False


def _keeps_spread(state: PlanState, nodes: list[ChainNode], last: int, dest: int) -> bool:
    """Whether the chain ending with node ``last`` landing on ``dest`` leaves every moved
    model spanning as many failure domains as before (up to what it requires), judged
    without touching the ledger, one move at a time: exact when the models of the chain are
    distinct (as in this repair's chains); a long chain that displaces two replicas of one
    model is checked again once applied (:func:`_apply_closing`,
    :func:`~grid_core.planner.chains.apply_chain`)."""
    ledger = state.ledger
    node = nodes[last]
    landing = dest
    while node.origin is not None and node.parent is not None:
        after = dict(ledger.domains[node.mi])
        after[ledger.domain_list[node.origin]] -= 1
        new = ledger.domain_list[landing]
        after[new] = after.get(new, 0) + 1
        spans = sum(1 for n in after.values() if n > 0)
        if min(spans, state.required_domains(node.mi)) < spread(state, node.mi):
            return False
        landing = node.origin
        node = nodes[node.parent]
    return True
