"""Long ejection chains: the planner's last search for a replica still short.

Source: specification, "Global placement loop": a deterministic bounded repair may evacuate
and re-place replicas when greedy placement fragments capacity. The settling repair
(:mod:`grid_core.planner.settle`) searches chains of up to
:data:`~grid_core.planner.chains.MAX_CHAIN_MOVES` moves and, at each host, tries only the
smallest and the largest departing replica that makes room. On the 64x32 bench fleets at
occupancy 0, the exact program that moves the fewest of the planner's new replicas (every
model keeping at least its count) shows what the seeds still furthest from the optimum need
for their next replica: five moves ending where a replica fits directly (seeds 59, 74), or
four and five moves that close on a host the chain changed, through a departing replica of
middle size (seeds 22, 63, 77, 79), or four replicas leaving one host at once, each for a
host where it fits (seed 80).

This pass runs once, on the finished plan, for the models still short (highest priority
first, one replica per model per round), within a step budget that grows with the fleet
(:func:`chain_budget`: :data:`LONG_CHAIN_BUDGET`, or :data:`LONG_CHAIN_STEPS_PER_PAIR` per
candidate (model, host) pair when that is more, at most :data:`LONG_CHAIN_BUDGET_CAP`), and
never more than :data:`LONG_CHAIN_STEP_LIMIT` steps in all:

* a chain has up to :data:`LONG_CHAIN_MOVES` moves; at a host the short model (or a
  displaced replica) may take, every new replica whose departure makes room is a successor;
* a chain ends where the last displaced replica fits a host the chain has not used, or on
  a host an earlier move changed, when the replica that left there made room for two (the
  closing landing of :mod:`grid_core.planner.settle`);
* a search first follows only chains that can still end directly: per model, the fewest
  further displacements after which one of its replicas can land where it fits
  (:meth:`_LongChains._levels`, from a move map judged by memory alone, so never too many)
  both prunes and orders it, best first; each departing replica is a successor once;
* when that fails, up to :data:`VACATE_MOVES` new replicas may leave a host where the short
  model lacks memory, largest first, each for a different host where it fits directly;
* when that fails too, a second search also admits a replica displaced from a host that keeps a
  free model slot and room for one more (a *cycle*: what it displaces may land back there),
  each departing replica a successor once per predecessor model.

:func:`deep_chains` runs the same search once more at the very end of the packing passes,
after the trades that drop replicas, with chains of up to :data:`DEEP_CHAIN_MOVES` moves and
a fixed budget of its own (:data:`DEEP_CHAIN_BUDGET`), on fleets small enough for that budget
to cover several move maps (:data:`DEEP_CHAIN_MAPS`). Run last it only adds replicas, so it
cannot leave any plan worse in priority order: the same depth in the first pass placed
more on some fleets but fewer on others, whose later passes then found other room.

As in every repair, only new replicas move (nothing live, no pin reservation or hold, no
replica on a host holding its cached weights), each move obeys the ledger's hard rules and
no moved model spans fewer failure domains than before (up to its requirement): the pass only
adds a replica, so no class places fewer and the rest of the plan is unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from grid_core.planner.chains import REPAIRABLE, ChainNode
from grid_core.planner.core import PlanState
from grid_core.planner.exchange import movables, open_candidates, spread
from grid_core.planner.ledger import Placed
from grid_core.planner.settle import _Chains, fit_hosts

LONG_CHAIN_MOVES = 5
"""Replicas one long chain may place or move (the short model's replica plus four displaced
ones): one more than the settling repair. See :data:`LONG_CHAIN_BUDGET` for what it places."""
VACATE_MOVES = 4
"""New replicas that may leave one host together so that a short model fits there (seed 80's
next replica needs four to leave a 192 GB Mac; on seeds 1-110 this finds that one replica
and nothing else, for about 0.1 ms on 64x32 s2 where it fails)."""
LONG_CHAIN_BUDGET = 24_000
"""Steps (a candidate host examined while building the move map, a node or a successor
examined in a search) one plan's long chains may spend together on a small fleet (the
floor of :func:`chain_budget`). On the 64x32 bench fleets at occupancy 0, seeds 1-110:
6,000 place 9 more replicas, 12,000 11, 20,000 13 (seeds 56 and 100). Raised from 12,000
once the planner's native build halved a plan's CPU (2026-12-06): on fresh 64x32 fleets at
occupancy 0 (seeds 1-260), with :data:`DEEP_CHAIN_BUDGET` raised alike, 24,000 places 9 more
replicas than 12,000 and 48,000 13 (all priority 0; no fleet fewer in any class). 48,000
put 5 of those fleets above the 50 ms CPU p50 target (worst 52.4 ms, native); 24,000 none
(worst 47.1 ms, against 47.0 ms with 12,000)."""
LONG_CHAIN_STEPS_PER_PAIR = 8
"""Steps per candidate (model, host) pair of the fleet (:func:`chain_budget`). The move map
of one ledger state costs about 0.87 steps per pair (1,250 on 64x32 seed 2 with 1,510 pairs,
3,660 on 128x48 seed 402 with 4,205) and every chain placed changes the ledger, so the map is
built again: a fixed budget buys fewer searches the wider the fleet. :data:`LONG_CHAIN_BUDGET`
was measured on the 64x32 fleets (1,196-1,533 pairs), about 8 steps per pair; at 8 per pair
every 64x32 and 32x16 bench plan stays the same (at most 12,264 steps there), and on
128x48 at occupancy 0 (seeds 401-425; 3,882-4,498 pairs) and 96x40 (seeds 301-320) the
pass places 6 more replicas (128x48 seeds 402 +2, 410 +2, 415 +1; 96x40 seed 312 +1), by
chains that move a llama.cpp replica off a CUDA server's model slot to a Mac. 7 per pair
places 3 more, 16 six, 30 eight (402 +4) for three times the CPU there."""
LONG_CHAIN_BUDGET_CAP = 100_000
"""Most steps one plan's long chains spend however wide the fleet (reached from 12,500
candidate pairs, beyond 256x64, whose fleets have about 11,000): 28 ms of CPU on generated
192x96 and 256x128 fleets at occupancy 0 (seed 1; 12,258 and 22,254 pairs), where the
12,000 steps of a small fleet did not cover the first move map (11,116 and 20,375 steps)
and the capped budget places 2 and 1 more replicas. The budget is checked before each
placement and between the search's steps, so work begun below it (a move map, a vacating
scan) may end above it; :data:`LONG_CHAIN_STEP_LIMIT` bounds that."""
LONG_CHAIN_STEP_LIMIT = 2 * LONG_CHAIN_BUDGET_CAP
"""Most steps one plan's long chains take in all, whatever the fleet (0.1 s of CPU at the
0.37-0.65 microseconds a step costs). The budget alone let a crafted fleet of 640 hosts and
1,248 models (774,144 candidate pairs) spend 769,436 steps: the first move map (about one step
per pair, checked only as a whole) and a vacating scan ran to their end. Work whose size is
known before it starts (the move map, the scan for models that fit somewhere, one model's
hosts: one step per candidate pair at most) is not begun when it could cross this limit, and
the searches and the vacating scan stop at it; the pass then ends, keeping what it placed.
Twice the cap, so that work begun just below the budget ends as before: the bench fleets spend
at most 37,498 steps (128x48 seed 402), generated 192x96 and 256x128 fleets 100,328."""

DEEP_CHAIN_MOVES = 8
"""Replicas one chain of the closing deep pass (:func:`deep_chains`) may place or move: the
short model's replica plus up to seven displaced ones. See :data:`DEEP_CHAIN_BUDGET`."""
DEEP_CHAIN_BUDGET = 24_000
"""Steps (counted as in :func:`long_chains`) the deep pass of one plan may take. On fresh
64x32 fleets at occupancy 0 (seeds 1-260) the pass adds 6 / 16 / 21 / 24 replicas with 6,000 /
9,000 / 12,000 / 20,000 steps (8 moves; 6, 7 and 10 moves add 14, 16 and 16 at 9,000), and
took 1.1 ms of CPU at the median of those plans, 5.1 ms at the 90th percentile and 7.3 ms at
most with 12,000 (8.0 and 11.5 ms with 20,000), interpreted. Raised from 12,000 to 24,000
with :data:`LONG_CHAIN_BUDGET` (2026-12-06, see there). It also lets the pass run on fleets
of up to 6,000 candidate pairs (:data:`DEEP_CHAIN_MAPS`, 128x48 included): on 26 other
fleets (128x48, 96x40 and 192x96 at occupancy 0, 64x32 at 0.3) both raised place 1 more
replica."""
DEEP_CHAIN_MAPS = 4
"""Move maps (about one step per candidate (model, host) pair each, built again after every
chain placed) that :data:`DEEP_CHAIN_BUDGET` must cover for the deep pass to run at all: on
a fleet with more than a quarter as many candidate pairs as steps the first map would take
most of the budget and leave nothing for a search (64x32 fleets have 1,196-1,550 pairs,
128x48 about 4,000)."""


def chain_budget(state: PlanState) -> int:
    """Steps one plan's long chains may spend: :data:`LONG_CHAIN_STEPS_PER_PAIR` per
    candidate (model, host) pair, never below :data:`LONG_CHAIN_BUDGET` nor above
    :data:`LONG_CHAIN_BUDGET_CAP` (a count, fixed for the plan)."""
    pairs = sum(len(hosts) for hosts in state.cands)
    scaled = LONG_CHAIN_STEPS_PER_PAIR * pairs
    return max(LONG_CHAIN_BUDGET, min(LONG_CHAIN_BUDGET_CAP, scaled))


@dataclass(slots=True)
class _Node(ChainNode):
    """A :class:`~grid_core.planner.chains.ChainNode` that also knows whether a host of its
    path could take one more replica (a model slot free where one replica left and one
    arrived): only then may a replica displaced after it close on a host the chain changed."""

    closable: bool = False
    cycle: bool = False
    """Admitted although no direct end is within reach: it may only end by closing."""


def long_chains(state: PlanState) -> int:
    """Place what is still short by long ejection chains; returns the replicas added (the
    steps taken, at most :data:`LONG_CHAIN_STEP_LIMIT`, go to ``state.long_chain_steps``)."""
    chains = _LongChains(state)
    if state.fit_map is not None:  # what the settling repair found, while no host changed
        versions, fits, ends = state.fit_map
        if versions == tuple(book.version for book in state.ledger.books):
            chains.fits = dict(fits)
            chains.ends = None if ends is None else set(ends)
    added = chains.rounds(chains.budget)
    state.long_chain_steps = chains.spent
    return added


def deep_chains(state: PlanState) -> int:
    """The planner's last packing search: long ejection chains of up to
    :data:`DEEP_CHAIN_MOVES` moves for the models still short, within
    :data:`DEEP_CHAIN_BUDGET` steps of their own (highest priority first, one replica per
    model per round). Runs only on a fleet small enough that the budget covers
    :data:`DEEP_CHAIN_MAPS` move maps. Returns the replicas added; like
    :func:`long_chains` it only adds, so no class places fewer."""
    if DEEP_CHAIN_MAPS * sum(len(hosts) for hosts in state.cands) > DEEP_CHAIN_BUDGET:
        return 0
    chains = _LongChains(state, DEEP_CHAIN_MOVES)
    chains.budget = DEEP_CHAIN_BUDGET
    return chains.rounds(DEEP_CHAIN_BUDGET)


class _LongChains(_Chains):
    """The settling repair's shared move map (where models fit, which models fit somewhere),
    with every departing replica that makes room as a successor (:meth:`_leaving`)."""

    def __init__(self, state: PlanState, moves: int = LONG_CHAIN_MOVES) -> None:
        super().__init__(state)
        self.moves = moves
        """Most replicas one chain places or moves (:data:`LONG_CHAIN_MOVES`, or
        :data:`DEEP_CHAIN_MOVES` in :func:`deep_chains`)."""
        self.budget = chain_budget(state)
        self.leaving: dict[int, list[tuple[int, Placed]]] = {}
        self.levels: dict[int, int] | None = None
        self.room: dict[tuple[int, int, int], bool] = {}
        self.smallest = 0
        """MB of the smallest new replica that may move (set with :meth:`_levels`): a host
        where less than that stays free after a swap can take no closing replica."""
        self.stopped = False
        """The pass reached :data:`LONG_CHAIN_STEP_LIMIT`: it places nothing more."""

    def _afford(self, steps: int) -> bool:
        """Whether ``steps`` more steps (and the few hosts a closing check may examine
        after a step: at most :data:`LONG_CHAIN_MOVES`) stay within
        :data:`LONG_CHAIN_STEP_LIMIT`; when not, the pass stops for good."""
        if self.spent + steps + self.moves > LONG_CHAIN_STEP_LIMIT:
            self.stopped = True
        return not self.stopped

    def _fits(self, mi: int) -> list[int]:
        """The hosts where one more replica of ``mi`` fits directly (one step per candidate
        host, remembered while the ledger stands); none once the pass has stopped."""
        if mi not in self.fits and not self._afford(len(self.state.cands[mi])):
            return []
        return super()._fits(mi)

    def _changed(self) -> None:
        super()._changed()
        self.leaving.clear()
        self.room.clear()
        self.levels = None

    def _back(self, movable: list[int]) -> dict[int, set[int]]:
        """Per model, the movable models that could take a host once one of its new replicas
        leaves it, judged by memory and presence alone (a superset of the exact successors,
        so levels built on it never exclude a chain that exists)."""
        state = self.state
        books = state.ledger.books
        hosts: dict[int, Sequence[Placed]] = {}
        back: dict[int, set[int]] = {}
        for xi in movable:
            mems = state.mem_rows[xi]
            for hi in open_candidates(state, xi):
                book = books[hi]
                self.spent += 1
                leaving = hosts.get(hi)
                if leaving is None:
                    leaving = hosts[hi] = movables(state, hi, largest_first=True)
                if not leaving:
                    continue
                short_mb = mems[hi] - min(book.inc_free, book.raw_free)
                for pl in leaving:
                    if pl.memory_mb < short_mb:
                        break
                    got = back.get(pl.mi)
                    if got is None:
                        back[pl.mi] = {xi}
                    else:
                        got.add(xi)
        return back

    def _levels(self) -> dict[int, int] | None:
        """Per movable model, the fewest further displacements after which a chain through
        one of its replicas can end where a replica fits directly (0: it fits somewhere
        now), ignoring which hosts the chain uses; models that cannot are left out.
        ``None`` (and the pass stops) when the move map, one step per candidate pair of the
        movable models at most, could cross :data:`LONG_CHAIN_STEP_LIMIT`."""
        if self.levels is None:
            state = self.state
            movable = self._movable()
            if not self._afford(sum(len(state.cands[xi]) for xi in movable)):
                return None
            self.smallest = min(
                (state.mem_rows[xi][hi] for xi in movable for hi in state.cands[xi]), default=0
            )
            back = self._back(movable)
            level = dict.fromkeys(sorted(self._ends()), 0)
            frontier = list(level)
            depth = 0
            while frontier and depth < self.moves:
                depth += 1
                nxt = []
                for yi in frontier:
                    for xi in sorted(back.get(yi, ())):
                        if xi not in level:
                            level[xi] = depth
                            nxt.append(xi)
                frontier = nxt
            self.levels = level
        return self.levels

    def _leaving(self, mi: int) -> list[tuple[int, Placed]]:
        """(host, new replica whose departure lets ``mi`` fit there), every such replica,
        host by host in candidate order and smallest first; remembered while the ledger
        stands."""
        got = self.leaving.get(mi)
        if got is not None:
            return got
        state = self.state
        if not self._afford(len(state.cands[mi])):
            return []  # the pass has stopped; nothing is remembered
        books = state.ledger.books
        mems = state.mem_rows[mi]
        got = []
        for hi in open_candidates(state, mi):
            self.spent += 1
            if state.fit_reason(mi, hi) not in REPAIRABLE:
                continue
            book = books[hi]
            # MB a departing replica must release (the quick part of fit_after_leaving)
            short_mb = mems[hi] - min(book.inc_free, book.raw_free)
            got.extend(
                (hi, pl)
                for pl in movables(state, hi, largest_first=False)
                if pl.memory_mb >= short_mb
            )
        self.leaving[mi] = got
        return got

    def _makes_room(self, mi: int, hi: int, leaving: Placed) -> bool:
        """Whether ``mi`` fits ``hi`` once ``leaving`` has left, by every hard rule
        (:meth:`~grid_core.planner.ledger.Ledger.fit_after_leaving`), remembered while the
        ledger stands: a successor in :meth:`_leaving` is only checked in full when a search
        reaches it."""
        key = (mi, hi, leaving.mi)
        got = self.room.get(key)
        if got is None:
            got = self.room[key] = self.state.ledger.fit_after_leaving(mi, hi, leaving) is None
        return got

    def place(self, mi: int) -> bool:
        """Place one more replica of ``mi``: by the shortest chain that ends directly, else
        by vacating part of a host, else by a chain through a cycle; True when placed (the
        ledger is unchanged otherwise)."""
        if self.ends is None and not self._afford(self._unscanned()):
            return False
        if self.stopped or (not self._ends() and not self._fits(mi)):
            return False
        return self._search(mi, False) or self._vacate(mi) or self._search(mi, True)

    def _unscanned(self) -> int:
        """Steps finding the models that fit somewhere may take: the candidate hosts of
        every movable model whose hosts are not known yet."""
        cands = self.state.cands
        return sum(len(cands[xi]) for xi in self._movable() if xi not in self.fits)

    def _vacate(self, mi: int) -> bool:
        """Place ``mi`` on a host where it is short of memory once up to
        :data:`VACATE_MOVES` new replicas leave it, each for a host where it fits directly
        (largest first, so as few as possible move); True when placed."""
        state = self.state
        ledger = state.ledger
        books = ledger.books
        ends = self._ends()
        mems = state.mem_rows[mi]
        for hi in open_candidates(state, mi):
            if not self._afford(1):
                return False
            self.spent += 1
            if state.fit_reason(mi, hi) != "memory":
                continue
            book = books[hi]
            inc_short = mems[hi] + ledger.headroom_extra(mi, hi) - book.inc_free
            raw_short = mems[hi] - book.raw_free
            picked: list[Placed] = []
            taken: set[int] = set()  # one leaving replica per destination host
            for pl in movables(state, hi, largest_first=True):
                if not self._afford(1):
                    return False
                self.spent += 1
                if pl.mi not in ends:
                    continue
                dest = next((h for h in self._fits(pl.mi) if h != hi and h not in taken), None)
                if dest is not None:
                    taken.add(dest)
                    picked.append(pl)
                    inc_short -= pl.inc_mb
                    raw_short -= pl.raw_mb
                    if (inc_short <= 0 and raw_short <= 0) or len(picked) == VACATE_MOVES:
                        break
            enough = inc_short <= 0 and raw_short <= 0 and len(picked) > 1
            if enough and self._apply_vacate(mi, hi, picked):
                self._changed()
                return True
        return False

    def _apply_vacate(self, mi: int, hi: int, picked: list[Placed]) -> bool:
        """Move ``picked`` off ``hi`` (each to its best host where it fits directly once the
        earlier ones have landed) and place ``mi`` there; the ledger is restored exactly
        when one finds no host, ``mi`` still does not fit, or a moved model would span fewer
        failure domains."""
        state = self.state
        ledger = state.ledger
        before = {pl.mi: spread(state, pl.mi) for pl in picked}
        for pl in picked:
            ledger.remove(pl.mi, hi)
        landed: list[tuple[int, int]] = []
        ok = ledger.fit_new(mi, hi) is None
        if ok:
            ledger.place(mi, hi, "repair", state.score_now(mi, hi))
            for pl in picked:
                dests = [h for h in fit_hosts(state, pl.mi) if h != hi]
                if not dests:
                    ok = False
                    break
                dest = max(dests, key=lambda h: (state.score_now(pl.mi, h), -h))
                ledger.place(pl.mi, dest, "repair", state.score_now(pl.mi, dest))
                landed.append((pl.mi, dest))
            ok = ok and all(spread(state, x) >= n for x, n in before.items())
        if ok:
            return True
        for xi, dest in reversed(landed):
            ledger.remove(xi, dest)
        if mi in ledger.books[hi].models:
            ledger.remove(mi, hi)
        for pl in reversed(picked):
            ledger.place(pl.mi, hi, pl.reason, pl.score)
        return False

    def _search(self, mi: int, cycles: bool) -> bool:
        """One best-first search for a chain placing ``mi``; with ``cycles`` also through
        replicas that can only end by closing (see the module notes); True when placed."""
        state = self.state
        ends = self._ends()
        books = state.ledger.books
        levels = self._levels()
        if levels is None:
            return False
        smallest = self.smallest
        nodes: list[ChainNode] = [_Node(mi, None, None, None, 1, frozenset())]
        seen: set[tuple[int, int, int]] = set()
        frontier = [(0, 0)]  # (moves so far + fewest still needed, node index)
        most = self.moves
        stop_at = LONG_CHAIN_STEP_LIMIT - most  # as _afford(1), inline
        while frontier and self.spent < self.budget:
            if self.stopped or self.spent >= stop_at:
                self.stopped = True
                return False
            k = heapq.heappop(frontier)[1]
            node = nodes[k]
            assert isinstance(node, _Node)
            xi = node.mi
            self.spent += 1
            if k == 0 or xi in ends:
                ended = self._end(nodes, k)
                if ended is not None:
                    return ended
            parent = nodes[node.parent] if node.parent is not None else None
            if isinstance(parent, _Node) and parent.closable and self._close(nodes, k):
                return True
            if node.moves >= most:
                continue
            last = node.moves + 1 == most
            reach = most - node.moves - 1  # displacements left after a child
            mems = state.mem_rows[xi]
            for hi, leaving in self._leaving(xi):
                if self.spent >= stop_at:  # a refused _fits stops the search at the next node
                    self.stopped = True
                    return False
                self.spent += 1
                yi = leaving.mi
                if hi in node.path or yi == mi:
                    continue
                if last:  # a leaf: kept only when it can end, and never marked seen
                    if not (
                        yi in ends and any(h not in node.path and h != hi for h in self._fits(yi))
                    ) and not (node.closable and self._could_close(nodes, k, yi)):
                        continue
                elif (yi, hi, xi if cycles else -1) in seen:
                    continue
                book = books[hi]
                # room left on ``hi`` once ``leaving`` goes and ``xi`` arrives: could one
                # more replica close the chain there later?
                room = min(book.inc_free, book.raw_free) + leaving.memory_mb - mems[hi]
                free_slot = room >= smallest and not (
                    book.max_models and len(book.present) >= book.max_models
                )
                cycle = not last and levels.get(yi, most) > reach
                if cycle and not (
                    (cycles and free_slot and not node.cycle)
                    or (node.closable and self._could_close(nodes, k, yi))
                ):
                    continue
                if not self._makes_room(xi, hi, leaving):
                    continue
                if not last:
                    seen.add((yi, hi, xi if cycles else -1))
                closable = node.closable or free_slot
                estimate = node.moves + 1 + (0 if cycles else levels.get(yi, 0))
                heapq.heappush(frontier, (estimate, len(nodes)))
                nodes.append(
                    _Node(yi, hi, leaving, k, node.moves + 1, node.path | {hi}, closable, cycle)
                )
        return False

    def _could_close(self, nodes: list[ChainNode], k: int, yi: int) -> bool:
        """Whether a replica of ``yi`` displaced by node ``k``'s replica could land on a host
        of node ``k``'s path by memory and slots (the first of :meth:`_closing_hosts`; what
        :meth:`_close` then checks in full)."""
        return next(self._closing_hosts(nodes, k, yi), None) is not None
