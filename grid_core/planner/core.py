"""The placement loop: profiles, host snapshots and demand in, one deterministic plan out.

Source: specification, "Global placement loop" and "Safety invariants" 1, 2, 5 and 10. The
order of decisions (see docs/planner.md):

1. canonicalise inputs (sorted) and hash them;
2. desired replica counts (demand clamped to min/max; a pinned model wants its pins);
3. seed healthy incumbents (priority high to low) within the desired ledger, model-slot
   ceilings and colocation (holding back same-domain surplus while a domain is missing);
   surplus live work on a host whose ceiling was lowered is evicted;
4. reserve hard pins (exact host; staged preemption on that host; never a substitute);
5. per priority class, high to low: baseline, direct-demand, then inferred-only rounds, one
   replica per model per round (max-min fair), failure-domain diversity reserved before
   scoring; a round cut short by capacity is re-decided by attributable harm; bounded repair
   and ejection chains; held-back incumbents re-admitted; staged preemption in fair rounds;
6. unmet constraints for every shortfall;
7. while demand stays unmet, at most one re-plan with prices learned from what bound in the
   plan before (grid_core.planner.replan), then one that holds room for the models still
   short (grid_core.planner.holds), each kept only when it places more; exchange repair
   on the plan kept (grid_core.planner.exchange), then one candidate with held room and a
   size price on hosts without a model-slot ceiling, kept only when it places more and no
   priority class fewer (grid_core.planner.replan.size_prices); then the settling repair
   (shifts and ejection chains with budgets of their own) for what is still short
   (grid_core.planner.settle); last, while a model below the top class is still short, one
   candidate whose classes pay for the hosts the short classes below them need, kept on
   the same terms (grid_core.planner.replan.lower_class_prices);
8. on a plan that places every needed replica and stages nothing, new replicas move so the
   hosts it leaves empty are the ones the fewest models could use (grid_core.planner.spare).
"""

from __future__ import annotations

import enum
from typing import final

import msgspec

from grid_core.demand.desired import startup_path_s
from grid_core.demand.types import ModelDemand
from grid_core.planner.eligibility import (
    SERVING_STATES,
    host_signature,
    incompatibility,
    outlasts_protection,
)
from grid_core.planner.ledger import Ledger, Placed
from grid_core.planner.preemption import VictimCandidate, VictimNeed, VictimSelector
from grid_core.planner.scarcity import Scarce, lost_placements, scarcity_table
from grid_core.planner.scoring import (
    ScoreContext,
    ScoreTerm,
    speed_weight,
    split_terms,
)
from grid_core.planner.topology import LedgerTables, Statics, Topology
from grid_core.planner.types import Assignment, Eviction, PlanInputs, UnmetResource
from grid_core.profile import ModelProfile, revision_matches
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

SCARCITY_PENALTY = 80.0
"""Score cost of one expected lost placement of another still-short model: above best fit
(10) and hardware priors, below a new failure domain (100), cached weights (300) and a ready
residency (1000), so scarcity steers new replicas but never undoes locality."""
LEARNED_PRICE_CAP = 3.0
"""Most expected lost placements one new replica is charged from a re-plan's learned prices
(:mod:`grid_core.planner.replan`): 3 x 80 = 240 stays below the cached-weights bonus (300)
and a ready residency (1000), so learned prices steer cold placements and never undo
locality (on the bench fleets it places as many replicas as no cap at all)."""
SLOT_FIT_WEIGHT = 30.0
"""Score cost of a new replica whose size is far from its host's memory per free model slot
(free memory / free slots, on hosts with a slot ceiling): ``weight x |share - size| / share``,
at most :data:`SLOT_FIT_CAP` shares. A small replica in a large slot strands memory only a
larger model could use; a large one in a small slot leaves the host's other slots too little
memory. Below a new failure domain (100) and cached weights (300). Measured on the 64x32
bench fleets at occupancy 0, seeds 1-35, with held-room re-plans (grid_core.planner.holds):
weights 20 / 30 / 40 place 5,951 / 5,958 / 5,955 replicas, none 5,928."""
SLOT_FIT_CAP = 1.0
"""Most slot shares the :data:`SLOT_FIT_WEIGHT` mismatch counts (so the cost is at most 30)."""
MIN_RESIDENCY_STATES = frozenset({"loading", "warming", "ready"})
"""States whose minimum residency protects them from preemption (failed/draining never)."""

RoundKey = tuple[int, int, int, tuple[float, ...], str]
"""Fair-round order of a model: (-priority, candidate hosts, -MB, negated harm, model id)."""
Prices = tuple[float, float, float, float]
"""The planner's packing prices of one new replica, subtracted from its term score in this
order: (learned, slot fit, size, scarcity); see :meth:`PlanState.scored`."""
NO_PRICES: Prices = (0.0, 0.0, 0.0, 0.0)
"""The prices remembered for a host where the model does not fit (never read)."""


@final
class FitMemo:
    """What :meth:`PlanState.best_host` remembers of one model on one host. Never changed
    once made (untouched hosts of one class share an entry).

    A class, not a tuple: the native build (:mod:`grid_core.native`) copies a typed tuple's fields
    out each time one is read from a list or dict and into a new tuple each time it is
    stored, where an instance is shared by reference.

    Attributes:
        version: the host book's version the entry was made at (-1: never made).
        why: the fit failure, or ``None`` when the replica fits.
        domain_new: the domain novelty the score was computed for.
        score: the replica's score on the host (0.0 when it does not fit).
        prices: the packing prices inside that score (:data:`NO_PRICES` when it does not fit).
    """

    __slots__ = ("domain_new", "prices", "score", "version", "why")

    def __init__(
        self, version: int, why: str | None, domain_new: bool, score: float, prices: Prices
    ) -> None:
        self.version = version
        self.why = why
        self.domain_new = domain_new
        self.score = score
        self.prices = prices


OpeningKey = tuple[int, int, bool, tuple[float, float] | None]
"""(model, host class, domain novelty, the host's learned price pair or ``None``): everything
a new replica's fit and score on an untouched candidate host depend on (see
:meth:`PlanState._opening_entry`)."""
UNSEEN = FitMemo(-1, "unseen", False, 0.0, NO_PRICES)
"""A fit memo entry not computed yet: its version (-1) matches no host book (versions start
at 0), so the hottest loop needs no separate test for a missing entry."""
RankedPool = tuple[tuple[int, int], list[VictimCandidate], VictimNeed]
"""A host's victim pool for one beneficiary: ((lowest candidate priority, total disruption),
candidates, what they must release)."""


class Unasked(enum.Enum):
    """Marker type: the victim selector has not been asked about this host version yet."""

    UNASKED = enum.auto()


VictimAnswer = tuple[VictimCandidate, ...] | None | Unasked
"""The selector's validated victims on one host (``None``: no safe set), or not asked yet."""


def desired_count(profile: ModelProfile, demand: ModelDemand | None) -> int:
    """Replicas wanted: demand clamped to ``[min_replicas, max_replicas]``, and at least one
    per pin (a pin is a floor: it guarantees a replica on its host, never caps the count)."""
    return max(demand_count(profile, demand), len(profile.pins))


def demand_count(profile: ModelProfile, demand: ModelDemand | None) -> int:
    """Replicas the demand asks for, clamped to ``[min_replicas, max_replicas]`` (pins aside)."""
    want = demand.desired_replicas if demand is not None else 0
    return max(profile.min_replicas, min(profile.max_replicas, want))


class PlanState:
    """Everything one plan computes; built and driven by :func:`grid_core.planner.plan`.

    Args:
        inputs: canonicalised plan inputs (profiles and hosts sorted by id).
        terms: the score terms to sum (from :class:`~grid_core.planner.hooks.PlannerHooks`).
        select_victims: the victim selector (``None`` disables preemption).
        shared: an earlier state of the same inputs and terms whose static indexes, ledger
            memo tables and memoised term scores this one reuses (a re-plan,
            :mod:`grid_core.planner.replan`).
        topology: the snapshot's shared hard-topology context (same timestamp, profiles,
            hosts and policy; any demand): its ledger tables and static indexes are reused,
            and filled by the first plan that builds them (:mod:`grid_core.planner.topology`).
    """

    def __init__(
        self,
        inputs: PlanInputs,
        terms: list[ScoreTerm],
        select_victims: VictimSelector | None,
        shared: PlanState | None = None,
        topology: Topology | None = None,
    ) -> None:
        self.inputs = inputs
        self.now = inputs.now
        self.policy = inputs.policy
        self.profiles: list[ModelProfile] = list(inputs.profiles)
        self.hosts: list[HostSnapshot] = list(inputs.hosts)
        tables: LedgerTables | None = None  # memo tables: the snapshot's, or the plan before's
        if topology is not None:
            tables = topology.tables
        elif shared is not None:
            tables = shared.ledger.tables
        self.ledger: Ledger = Ledger(self.profiles, self.hosts, self.policy, tables)
        self.static_terms, self.dynamic_terms = split_terms(terms)
        self.select_victims = select_victims
        self.demand = [inputs.demand.get(p.model_id) for p in self.profiles]
        self.desired = [
            desired_count(p, d) for p, d in zip(self.profiles, self.demand, strict=True)
        ]
        """Replicas each model is planned towards. For a pinned model whose pin host cannot
        take its replica this drops to what its demand alone asks for (see
        :func:`grid_core.planner.phases.place_pins`); :attr:`reported` keeps the full count."""
        self.reported = list(self.desired)
        """Desired replicas as the plan reports them (demand, bounds and pins)."""
        self.held = [d.held_replicas if d is not None else 0 for d in self.demand]
        """Per model, replicas of the desired count kept only for hysteresis (see
        :attr:`~grid_core.demand.types.ModelDemand.held_replicas`): kept, never placed."""
        by_id = {h.host_id: hi for hi, h in enumerate(self.hosts)}
        self.pin_hosts = [{by_id[h] for h in p.pins if h in by_id} for p in self.profiles]
        """Per model, the host indexes of its pins (registered hosts only)."""
        self._init_statics(shared, topology)
        self.scarce: dict[int, Scarce] = {}
        """Per host with needy models, their sizes, prefix sums of need and needs by model
        (:meth:`prepare_scarcity`)."""
        self._init_actions()
        self._init_candidate()
        self._init_search_memos()
        self.alloc = [h.allocatable_mb for h in self.hosts]

    def _init_actions(self) -> None:
        """What the plan stages besides its placements (preemptions, reclaims, relocations,
        held-back incumbents), all empty until the phases stage them."""
        self.reclaimed: list[tuple[int, int, str]] = []
        """Surplus replicas staged for reclaim: (model index, host index, beneficiary id)."""
        self.evictions: list[Eviction] = []
        self.evicted: set[tuple[str, str]] = set()
        self.staged: dict[int, int] = {}
        self.staged_binds: dict[int, list[tuple[str, UnmetResource]]] = {}
        """Per beneficiary, one (host id, resource its victims free) per staged preemption."""
        self.budget_hit: set[int] = set()
        self.settling: dict[int, set[str]] = {}
        """Per beneficiary, models whose last ready replica it may not take yet: only they
        would have completed a victim set, and its scale-out shortfall has not persisted
        (:mod:`grid_core.planner.lastready`; the unmet code ``shortfall_settling``)."""
        self.relocations: dict[int, tuple[str, str, str]] = {}
        """Per blocked model, the staged relocation (incumbent, from host, to host)."""
        self.relocation_binds: dict[int, UnmetResource] = {}
        """Per blocked model, what its staged relocation frees on the from host."""
        self.deferred: dict[int, list[tuple[int, ResidencySnapshot]]] = {}
        """Per model, incumbents held back so a missing failure domain can be filled."""
        self.off_pin: set[tuple[int, int]] = set()
        """(model, host) of deferred incumbents held back only because the model's pins
        take its room first: wanted work while the model is short, priced at its priority as
        a victim (:func:`grid_core.planner.phases.place_pins`)."""

    def _init_candidate(self) -> None:
        """The settings that make a re-plan or candidate plan differ from the first plan
        (prices, holds, its rival), each neutral until :mod:`grid_core.planner` sets it."""
        self.learned: list[tuple[float, float]] | None = None
        """Per host, (price of one model slot, price per MB) in expected lost placements,
        learned from an earlier pass of the same plan (:mod:`grid_core.planner.replan`)."""
        self.class_prices: dict[int, list[tuple[float, float]] | None] | None = None
        """Per priority class, (price of one model slot, price per MB) per host for that
        class's new replicas, replacing :attr:`learned` (the lower-class-aware candidate,
        :func:`grid_core.planner.replan.lower_class_prices`)."""
        self.slot_fit_weight = SLOT_FIT_WEIGHT
        """Weight of the slot-fit cost in :meth:`score` (a candidate plan may raise it)."""
        self.size_price: tuple[list[float], float] | None = None
        """Per host, expected lost placements per MB of a new replica above a floor (MB),
        for the size-priced candidate plan (:func:`grid_core.planner.replan.size_prices`)."""
        self.dominate: list[int] | None = None
        """For a candidate kept only if no class places fewer than its rival: the rival's
        replicas per class (highest first) before its exchanges; the candidate is abandoned
        as soon as a finished class is behind them (:func:`grid_core.planner.replan.behind`)."""
        self.finish_lowest = False
        """Whether such a candidate always finishes its lowest class (never abandoned there):
        its exchanges and settling run only after the solve and may still lift that class
        (the lower-class-aware candidate, :func:`grid_core.planner._lower_class_candidate`)."""
        self.holds: dict[int, set[int]] = {}
        """Per short lower-priority model, the hosts holding a hole for it until its class
        starts (:mod:`grid_core.planner.holds`)."""
        self.hold_for: list[int] = []
        """Models to hold holes for (those the plan before left short; a re-plan sets it)."""
        self.rival: PlanState | None = None
        """The best plan so far, for a re-plan: the re-plan is abandoned as soon as it is
        behind it (:func:`grid_core.planner.replan.behind`)."""

    def _init_statics(self, shared: PlanState | None, topology: Topology | None) -> None:
        """Static indexes and term memo tables: the re-plan's ``shared`` state's, else the
        snapshot ``topology``'s (built by the first plan that needs them), else new."""
        if shared is None:
            self.weights = [
                speed_weight(d, p.replica_concurrency * p.target_utilization)
                for p, d in zip(self.profiles, self.demand, strict=True)
            ]
            statics = topology.statics if topology is not None else None
            if statics is None:
                cands = self._candidates()
                host_class, class_rep = _host_classes(self.hosts)
                statics = Statics(
                    cands=cands,
                    mem_rows=[
                        {hi: self.ledger.memory(mi, hi)[1] for hi in hs}
                        for mi, hs in enumerate(cands)
                    ],
                    host_class=host_class,
                    class_rep=class_rep,
                    res_maps=[_residency_map(h) for h in self.hosts],
                )
                if topology is not None:
                    topology.statics = statics
            self.cands = statics.cands
            self.mem_rows = statics.mem_rows
            """Per model, MB of one new replica on each candidate host (runtime-specific)."""
            self.round_keys: dict[int, RoundKey] = {}
            """Memoised fair-round order key per model (fixed within one plan)."""
            self._static: dict[tuple[int, int], float] = {}
            self._sums: dict[tuple[int, int, int, bool], float] = {}
            """Summed term score per model, host class, free MB and domain novelty."""
            self._contexts: dict[tuple[int, int], ScoreContext] = {}
            """Score context per model and host class (free memory and domain replaced)."""
            self.host_class, self.class_rep = statics.host_class, statics.class_rep
            self.res_maps = statics.res_maps
        else:  # a re-plan of the same inputs: static indexes and term scores carry over
            self.weights = shared.weights
            self.cands = shared.cands
            self.mem_rows = shared.mem_rows
            self.round_keys = shared.round_keys
            self._static = shared._static
            self._sums = shared._sums
            self._contexts = shared._contexts
            self.host_class, self.class_rep = shared.host_class, shared.class_rep
            self.res_maps = shared.res_maps

    def _init_search_memos(self) -> None:
        """Per-plan search budgets spent and the memo tables the searches keep (each keyed by
        host version, so an entry is reused only while its host is unchanged)."""
        self.repair_steps = 0
        """Trial moves spent by repair (:mod:`grid_core.planner.repair`; at most the policy's
        ``repair_budget``; a candidate plan may start it nearly spent)."""
        self.chain_steps = 0
        """Host checks spent by ejection-chain searches (:mod:`grid_core.planner.chains`)."""
        self.exchange_steps = 0
        """Host pairs examined by exchange repair (:mod:`grid_core.planner.exchange`)."""
        self.long_chain_steps = 0
        """Steps the long ejection chains took (:mod:`grid_core.planner.longchains`; at most
        its ``LONG_CHAIN_STEP_LIMIT``)."""
        self.bump_trials = 0
        """Bump trials made by exchange repair (:mod:`grid_core.planner.exchange`)."""
        self.movable_memo: dict[tuple[int, bool], tuple[int, list[Placed]]] = {}
        """(host, largest first) → (host version, the new replicas exchange repair may move
        off that host, by size) (:mod:`grid_core.planner.exchange`)."""
        self.shift_memo: dict[int, tuple[int, list[Placed]]] = {}
        """Host → (host version, the new replicas repair may move off it, largest first)
        (:mod:`grid_core.planner.repair`)."""
        self.displace_memo: dict[tuple[int, int], tuple[int, Placed | None]] = {}
        """(displaced model, host) → (host version, the replica an ejection chain would move
        off that host for it, or ``None``) (:mod:`grid_core.planner.chains`)."""
        self.victim_cache: dict[tuple[int, int], tuple[int, RankedPool | None, VictimAnswer]] = {}
        """(beneficiary, host) → (host version, ranked victim pool, selector answer)."""
        self.last_round: list[int | None] = []
        """Host chosen per model in the latest fair round (``None`` = not placed)."""
        self.fit_map: tuple[tuple[int, ...], dict[int, list[int]], set[int] | None] | None = None
        """(every host's book version, model → hosts where one more new replica fits, models
        that fit somewhere), as the settling repair last saw the ledger
        (:mod:`grid_core.planner.settle`); the long chains reuse it while no host changed."""
        self._fit: list[list[FitMemo] | None] = [None] * len(self.profiles)
        """Per model, a row indexed by host (``None`` until the model is first scanned):
        (host book version, fit failure, domain novelty, score, prices), or :data:`UNSEEN`."""
        self.unheld_fit: dict[tuple[int, int], tuple[int, bool, float | None]] = {}
        """(model, host) → (host version, domain novelty, score of a new replica there once
        the holds it may release are given back, or ``None``: it does not fit even then)
        (:func:`grid_core.planner.holds.release_hold`); cleared with the prices."""
        self.opening_fit: dict[OpeningKey, FitMemo] = {}
        """What :meth:`best_host` found for a model on a candidate host whose book is still
        the opening one (version 0), shared by every such host of the same class, domain
        novelty and learned price (:meth:`_opening_entry`); cleared with the prices."""

    # --- static indexes -------------------------------------------------------------------
    def _candidates(self) -> list[list[int]]:
        """Per model, eligible hosts passing every static rule (cached per host class) and
        able to finish its requests (:func:`~grid_core.eligibility.placement_incompatibility`)."""
        by_sig: dict[tuple[object, ...], list[int]] = {}
        for hi, host in enumerate(self.hosts):
            if self.ledger.books[hi].eligible:
                by_sig.setdefault(host_signature(host), []).append(hi)
        out: list[list[int]] = []
        frac = self.policy.throttled_fraction
        hot = {hi for hi, h in enumerate(self.hosts) if h.state == "throttled"}
        for p in self.profiles:
            hs: list[int] = []
            for his in by_sig.values():
                if incompatibility(p, self.hosts[his[0]]) is not None:
                    continue
                if not hot:
                    hs.extend(his)
                    continue
                # the signature leaves out the protection state: a throttled host where the
                # model's requests outlast the grace takes no new replica of it
                hs.extend(
                    hi
                    for hi in his
                    if hi not in hot or not outlasts_protection(self.hosts[hi], p, frac)
                )
            hs.sort()
            out.append(hs)
        return out

    # --- scoring --------------------------------------------------------------------------
    def _context(self, mi: int, hi: int, domain_new: bool) -> ScoreContext:
        book = self.ledger.books[hi]
        inc, raw = book.inc_free, book.raw_free
        free = raw if raw < inc else inc
        key = (mi, self.host_class[hi])
        base = self._contexts.get(key)
        if base is None:  # the facts of one model on one host class; free memory varies
            p, host = self.profiles[mi], self.hosts[hi]
            perf = host.performance.get(p.model_id)
            cached = self.ledger.cached(mi, hi)
            base = ScoreContext(
                now=self.now,
                demand=self.demand[mi],
                memory_mb=self.ledger.memory(mi, hi)[1],
                allocatable_mb=self.alloc[hi],
                free_mb=free,
                domain_new=domain_new,
                speed_weight=self.weights[mi],
                cached=cached,
                resident=self.res_maps[hi].get(p.model_id),
                startup_s=startup_path_s(p, perf, cached),
            )
            self._contexts[key] = base
        if base.free_mb == free and base.domain_new == domain_new:
            return base
        # As msgspec.structs.replace would; positional (the fields' declared order) because
        # keywords cost more on this hot path.
        return ScoreContext(
            base.now,
            base.demand,
            base.memory_mb,
            base.allocatable_mb,
            free,
            domain_new,
            base.speed_weight,
            base.cached,
            base.resident,
            base.startup_s,
        )

    def prepare_scarcity(self, priority: int | None = None) -> None:
        """Price every host by how much the still-unplaced demand of the models of priority
        ``<= priority`` (all models when ``None``) needs it (:func:`.scarcity.scarcity_table`).
        Recomputed when a priority class starts: placements of higher classes are final."""
        self.scarce = scarcity_table(
            self.ledger, self.profiles, self.cands, self.mem_rows, self.desired, priority
        )
        self._fit = [None] * len(self.profiles)  # cached scores carry the old prices
        self.unheld_fit = {}
        self.opening_fit = {}

    def score(self, mi: int, hi: int, domain_new: bool) -> float:
        """Summed term score of a new replica of ``mi`` on ``hi`` minus the planner's own
        packing prices (unitless; larger is better); see :meth:`scored`."""
        return self.scored(mi, hi, domain_new)[0]

    def score_now(self, mi: int, hi: int) -> float:
        """:meth:`score` of a new replica of ``mi`` on ``hi`` as the ledger stands now: the
        replica counts as a new failure domain when the model has none on ``hi``'s domain."""
        ledger = self.ledger
        return self.score(mi, hi, ledger.domain_list[hi] not in ledger.domains[mi])

    def scored(self, mi: int, hi: int, domain_new: bool) -> tuple[float, Prices]:
        """(score, the packing prices inside it) of a new replica of ``mi`` on ``hi``.

        Terms see the host's facts, not its identity (:meth:`_term_score`). From their sum
        the planner's own prices are subtracted in turn (:data:`Prices`, 0.0 when one does
        not apply): the learned re-plan price (:attr:`learned`, or :attr:`class_prices` by
        the model's class), the slot-fit cost (:attr:`slot_fit_weight`), the size price
        (:attr:`size_price`) and the scarcity price, :data:`SCARCITY_PENALTY` per expected
        lost placement of other short models (:func:`.scarcity.lost_placements`). The prices
        do not depend on failure domains, so :meth:`best_host` keeps them when only the
        model's domains change (:meth:`_terms_now`). Reads the host's book as it is now (a
        trial may lend it memory without a new version, see
        :func:`grid_core.planner.holds._score_without`).
        """
        book = self.ledger.books[hi]
        inc, raw = book.inc_free, book.raw_free
        free = raw if raw < inc else inc  # min(inc, raw), without the builtin's call
        key = (mi, self.host_class[hi], free, domain_new)
        base = self._sums.get(key)
        if base is None:
            base = self._sums[key] = self._term_score(mi, hi, domain_new, free)
        mem = self.mem_rows[mi][hi]
        learn = fit = size = scarce = 0.0
        learned = self.learned
        if self.class_prices is not None:
            learned = self.class_prices[self.profiles[mi].priority]
        if learned is not None:
            slot_price, mb_price = learned[hi]
            lost = slot_price + mb_price * mem
            learn = SCARCITY_PENALTY * (lost if lost < LEARNED_PRICE_CAP else LEARNED_PRICE_CAP)
        max_models = book.max_models
        if max_models:  # slot fit: |memory per free slot - size| / memory per free slot
            slots_free = max_models - len(book.present)
            if slots_free > 0 and free > 0:
                share = free / slots_free
                off = abs(share - mem) / share
                fit = self.slot_fit_weight * (off if off < SLOT_FIT_CAP else SLOT_FIT_CAP)
        if self.size_price is not None:
            slopes, floor = self.size_price
            over = mem - floor
            if over > 0 and slopes[hi]:  # a replica larger than the short models' mean
                lost = slopes[hi] * over
                size = SCARCITY_PENALTY * (lost if lost < LEARNED_PRICE_CAP else LEARNED_PRICE_CAP)
        got = self.scarce.get(hi)
        if got is not None:
            scarce = SCARCITY_PENALTY * lost_placements(got, mi, mem, free, max_models, book)
        return base - learn - fit - size - scarce, (learn, fit, size, scarce)

    def _terms_now(self, mi: int, hi: int, domain_new: bool) -> float:
        """The term part of :meth:`scored` alone (same memo table, same value).

        It repeats :meth:`scored`'s first block on purpose: the two are the planner's
        hottest calls (thousands per plan), and a helper shared by both cost each call about
        40-70 ns more CPU (6-15 %, measured on 64x32 seed 2 at occupancy 0). Change both."""
        book = self.ledger.books[hi]
        inc, raw = book.inc_free, book.raw_free
        free = raw if raw < inc else inc
        key = (mi, self.host_class[hi], free, domain_new)
        base = self._sums.get(key)
        if base is None:
            base = self._sums[key] = self._term_score(mi, hi, domain_new, free)
        return base

    def _term_score(self, mi: int, hi: int, domain_new: bool, free: int) -> float:
        """Summed plugin term score; ``free`` is the host's free MB now.

        Hosts identical apart from id, heartbeat age and failure domain form one class and
        share every evaluation (the domain reaches terms only as ``ctx.domain_new``). Static
        terms run once per model/class (:attr:`_static`); the callers remember the whole
        sum per model/class/free-memory/domain-novelty state (:attr:`_sums`), so dynamic
        terms run once per such state."""
        cls = self.host_class[hi]
        key = (mi, cls)
        static = self._static.get(key)
        ctx = None
        if static is None:
            ctx = self._context(mi, hi, domain_new)
            static = _sum_terms(
                self.static_terms, self.profiles[mi], self.hosts[self.class_rep[cls]], ctx
            )
            self._static[key] = static
        if not self.dynamic_terms:
            return static
        if ctx is None or ctx.domain_new != domain_new:
            ctx = self._context(mi, hi, domain_new)
        dyn = _sum_terms(
            self.dynamic_terms, self.profiles[mi], self.hosts[self.class_rep[cls]], ctx
        )
        return static + dyn

    def needed(self, mi: int) -> int:
        """Replicas of ``mi`` that current demand needs: the desired count without the replicas
        only hysteresis holds, never below the baseline or the pins (new placement, rebuilds and
        destructive authority stop here; incumbents are kept up to :attr:`desired`)."""
        floor = self.profiles[mi].min_replicas
        pins = len(self.pin_hosts[mi])
        floor = pins if pins > floor else floor
        want = self.desired[mi]
        kept = want - self.held[mi]
        kept = floor if floor > kept else kept
        return kept if kept < want else want  # min(want, max(want - held, floor))

    def required_domains(self, mi: int) -> int:
        """Distinct failure domains the model's replicas must span (feasible target)."""
        return min(self.profiles[mi].min_failure_domains, self.desired[mi])

    def best_host(self, mi: int) -> tuple[int, float] | None:
        """Best host for one more replica of ``mi`` as ``(host index, score)``, or ``None``
        when no candidate host fits it now.

        While the model spans fewer failure domains than it requires, only hosts in a new
        domain are considered; when none fits, any domain is accepted and the shortfall is
        reported as ``failure_domain_shortfall``. Ties go to the first candidate host. Fit
        and score are remembered per host version (:attr:`_fit`).
        """
        ledger = self.ledger
        books = ledger.books
        domain_list = ledger.domain_list
        domains = ledger.domains[mi]
        need_new = len(domains) < self.required_domains(mi)
        new_hi = any_hi = -1
        new_s = any_s = 0.0
        mems = self.mem_rows[mi]
        cache = self._fit_row(mi)
        lrow = self.learned  # the learned prices this model pays, per host
        if self.class_prices is not None:
            lrow = self.class_prices[self.profiles[mi].priority]
        opening = self.opening_fit
        host_class = self.host_class
        for hi in self.cands[mi]:
            book = books[hi]
            got = cache[hi]
            if got.version == book.version:
                if got.why is not None:
                    continue  # still does not fit
                domain_new = domain_list[hi] not in domains
                if got.domain_new == domain_new:
                    s = got.score
                else:  # only the domain changed: the prices stand
                    learned, fit, size, scarce = prices = got.prices
                    s = self._terms_now(mi, hi, domain_new) - learned - fit - size - scarce
                    cache[hi] = FitMemo(book.version, None, domain_new, s, prices)
            else:
                mem = mems[hi]
                if book.inc_free < mem or book.raw_free < mem:  # cheap, most rejects
                    why: str | None = "blocked" if book.blocked else "memory"
                elif book.max_models and len(book.present) >= book.max_models:
                    why = "slots"  # as fit_new would say (or an earlier reason of its)
                elif not book.version:  # untouched: its class's entry serves (_opening_entry)
                    domain_new = domain_list[hi] not in domains
                    key = (mi, host_class[hi], domain_new, None if lrow is None else lrow[hi])
                    entry = opening.get(key)
                    if entry is None:
                        entry = opening[key] = self._opening_entry(mi, hi, domain_new)
                    cache[hi] = entry
                    why, s = entry.why, entry.score
                else:
                    why = ledger.fit_new(mi, hi)
                    if why is None:
                        domain_new = domain_list[hi] not in domains
                        s, prices = self.scored(mi, hi, domain_new)
                        cache[hi] = FitMemo(book.version, None, domain_new, s, prices)
                if why is not None:
                    cache[hi] = FitMemo(book.version, why, False, 0.0, NO_PRICES)
                    continue
            if domain_new and (new_hi < 0 or s > new_s):
                new_s, new_hi = s, hi
            if any_hi < 0 or s > any_s:
                any_s, any_hi = s, hi
        if need_new and new_hi >= 0:
            return new_hi, new_s
        return None if any_hi < 0 else (any_hi, any_s)

    def _opening_entry(self, mi: int, hi: int, domain_new: bool) -> FitMemo:
        """The fit memo entry of ``mi`` on candidate host ``hi`` whose book is still the
        opening one (version 0), for :meth:`best_host` to share under its
        :data:`OpeningKey`.

        Hosts of one class differ only in id, heartbeat age and failure domain, and a
        candidate host is eligible, so untouched ones open with the same book; the scarcity
        table is built from books and footprints, never host ids, so it gives them the same
        entry, and the size price and slot fit read only the book and the footprint. What
        remains per host is the failure domain (its novelty is in the key) and the learned
        price (its pair is in the key), so the entry is the same for every host sharing it."""
        why = self.ledger.fit_new(mi, hi)
        if why is not None:
            return FitMemo(0, why, False, 0.0, NO_PRICES)
        s, prices = self.scored(mi, hi, domain_new)
        return FitMemo(0, None, domain_new, s, prices)

    def _fit_row(self, mi: int) -> list[FitMemo]:
        """``mi``'s row of the fit memo (made on first use after the prices change)."""
        row = self._fit[mi]
        if row is None:
            row = self._fit[mi] = [UNSEEN] * len(self.hosts)
        return row

    def fit_reason(self, mi: int, hi: int) -> str | None:
        """Why a new replica of ``mi`` cannot go on candidate host ``hi`` now (``None``: it
        fits), as :meth:`~grid_core.planner.ledger.Ledger.fit_new` says, reusing what
        :meth:`best_host` found while the host is unchanged (repair scans the same hosts
        right after a failed best-host search)."""
        book = self.ledger.books[hi]
        row = self._fit_row(mi)
        got = row[hi]
        if got.version == book.version:
            why = got.why
            if why == "memory" and self.profiles[mi].model_id not in book.present:
                return why  # the quick check's "memory" is fit_new's unless it is present
            if why is None:
                return None
        why = self.ledger.fit_new(mi, hi)
        if why is not None:
            row[hi] = FitMemo(book.version, why, False, 0.0, NO_PRICES)
        return why

    # --- helpers used by the phases -------------------------------------------------------
    def protected(self, mi: int | None, res_loaded_at: float | None, state: str) -> bool:
        """Minimum residency protects a recently loaded live replica from preemption."""
        if mi is None or state not in MIN_RESIDENCY_STATES or res_loaded_at is None:
            return False
        return self.now - res_loaded_at < self.profiles[mi].min_residency_s

    def assignments(self) -> list[Assignment]:
        """The plan's assignments in (model id, host id) order."""
        out: list[Assignment] = []
        for pl in self.ledger.placements():
            out.append(self._assignment(pl))
        return out

    def _assignment(self, pl: Placed) -> Assignment:
        return Assignment(
            model_id=self.profiles[pl.mi].model_id,
            host_id=self.hosts[pl.hi].host_id,
            incumbent=pl.incumbent,
            runtime=pl.runtime,
            memory_mb=pl.memory_mb,
            reason=pl.reason,
            score=pl.score,
        )


def _sum_terms(
    terms: list[ScoreTerm], profile: ModelProfile, host: HostSnapshot, ctx: ScoreContext
) -> float:
    """Sum of ``terms``' scores in their order (a plain loop: as ``sum`` adds, but cheaper)."""
    acc: float = 0.0
    for t in terms:
        acc += t.score(profile, host, ctx)
    return float(acc)


def _residency_map(host: HostSnapshot) -> dict[str, ResidencySnapshot]:
    """Model id → its residency on the host, a serving one when several copies are listed."""
    out: dict[str, ResidencySnapshot] = {}
    for r in host.residencies:
        if r.model_id not in out or r.state in SERVING_STATES:
            out[r.model_id] = r
    return out


def _host_classes(hosts: list[HostSnapshot]) -> tuple[list[int], list[int]]:
    """(class per host, representative host per class): hosts identical apart from id,
    heartbeat age and failure domain share a class, in first-seen (host id) order."""
    keys: dict[bytes, int] = {}
    host_class: list[int] = []
    reps: list[int] = []
    for hi, h in enumerate(hosts):
        key = msgspec.json.encode(
            msgspec.structs.replace(h, host_id="", heartbeat_age_s=None, failure_domain=None)
        )
        cls = keys.setdefault(key, len(keys))
        if cls == len(reps):
            reps.append(hi)
        host_class.append(cls)
    return host_class, reps


def serving_incumbents(state: PlanState, mi: int) -> list[tuple[int, ResidencySnapshot]]:
    """Healthy live residencies of ``mi`` on eligible, compatible hosts, best first.

    Preference: unmanaged work (it stays anyway), ready before warming before loading,
    replicas inside their minimum residency, then host id. A residency of another artifact
    revision than the profile's digest (or of an unknown one) is not an incumbent: it does
    not satisfy placement, so the new revision is placed (on another host while the old
    one still holds this host's slot) and the old replica drains only once it is replaced
    (specification, "Managed host actuator"). A replica on a throttled host where one of its
    requests would outlast the protection drain grace is not an incumbent either, with the
    same make-before-break (:func:`~grid_core.eligibility.outlasts_protection`).
    """
    profile = state.profiles[mi]
    mid = profile.model_id
    out = []
    for hi in state.cands[mi]:
        if not state.hosts[hi].residencies:
            continue  # most hosts of a fresh fleet: skip building the search
        res = next(
            (
                r
                for r in state.hosts[hi].residencies
                if r.model_id == mid
                and r.state in SERVING_STATES
                and revision_matches(profile, r.artifact_sha256)
            ),
            None,
        )
        if res is None or outlasts_protection(
            state.hosts[hi], profile, state.policy.throttled_fraction
        ):
            continue
        rank = {"ready": 0, "warming": 1, "loading": 2}[res.state]
        sticky = state.protected(mi, res.loaded_at, res.state)
        out.append(((0 if not res.actuatable else 1, rank, 0 if sticky else 1, hi), hi, res))
    out.sort(key=lambda t: t[0])
    return [(hi, res) for _, hi, res in out]
