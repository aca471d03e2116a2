"""Capacity-aware placement: ``plan(inputs, hooks) -> Plan`` (pure and deterministic).

Source: specification, "Global placement loop" and "Safety invariants" 1, 2, 5, 10. The
phases live in :mod:`grid_core.planner.phases`; docs/planner.md walks through them.
"""

# ruff: noqa: E402 -- the planner modules are imported after NATIVE has chosen their build

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict

import msgspec

from grid_core import native
from grid_core.errors import ValidationError

NATIVE = native.activate(__path__)
"""Which planner build runs in this process (:mod:`grid_core.native`): decided before any
other planner module is imported, since the package path it may extend decides where they
come from."""

from grid_core.planner import topology
from grid_core.planner.chains import CHAIN_PLAN_BUDGET
from grid_core.planner.classtrade import class_trades
from grid_core.planner.core import PlanState, desired_count
from grid_core.planner.displace import displace_rounds
from grid_core.planner.exchange import exchange_rounds
from grid_core.planner.holds import lift_holds, reserve_holds, short_models
from grid_core.planner.hooks import NO_HOOKS, PlannerHooks
from grid_core.planner.longchains import deep_chains, long_chains
from grid_core.planner.pairswap import pair_exchange_rounds
from grid_core.planner.phases import (
    place_class,
    place_pins,
    preempt_rounds,
    readmit_deferred,
    round_key,
    seed_incumbents,
)
from grid_core.planner.preemption import VictimSelector
from grid_core.planner.relocation import mark_make_before_break, relocate_for
from grid_core.planner.repair import homogeneous_empty, repair_class
from grid_core.planner.replan import (
    LOWER_CLASS_SLOT_FIT_WEIGHT,
    MAX_REPLANS,
    SIZE_CANDIDATE_REPAIR_STEPS,
    behind,
    class_counts,
    dominates,
    improves,
    learned_prices,
    lower_class_prices,
    size_prices,
)
from grid_core.planner.report import surplus_report, unmet
from grid_core.planner.scoring import ScoreTerm
from grid_core.planner.settle import settle
from grid_core.planner.spare import keep_spare
from grid_core.planner.split import split_rounds
from grid_core.planner.topology import Topology, lookup, topology_for
from grid_core.planner.twin import twin_rounds
from grid_core.planner.types import (
    Assignment,
    Eviction,
    Plan,
    PlanInputs,
    PlannerPolicy,
    Unmet,
)
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

MEMO_SIZE = 4
"""Plans remembered by input digest: a repeated status read or tick with identical inputs
reuses the plan instead of solving again; four covers alternating reads without growth."""

_MEMO: OrderedDict[tuple[str, int], tuple[PlannerHooks, Plan]] = OrderedDict()
"""(digest, id(hooks)) → (hooks, plan); holding the hooks keeps their id from being reused."""

__all__ = [
    "NO_HOOKS",
    "Assignment",
    "Eviction",
    "Plan",
    "PlanInputs",
    "PlannerHooks",
    "PlannerPolicy",
    "Unmet",
    "canonical_inputs",
    "desired_count",
    "input_digest",
    "plan",
    "topology",
]


def canonical_inputs(inputs: PlanInputs) -> PlanInputs:
    """Inputs in canonical order (profiles, hosts, residencies sorted by id).

    Raises:
        ValidationError: two profiles or two hosts share an id.
    """
    profiles = tuple(sorted(inputs.profiles, key=lambda p: p.model_id))
    hosts = tuple(sorted((_sorted_residencies(h) for h in inputs.hosts), key=lambda h: h.host_id))
    for a, b in itertools.pairwise(profiles):
        if a.model_id == b.model_id:
            msg = f"plan inputs: model '{a.model_id}' is listed twice; pass one profile per id"
            raise ValidationError(msg)
    for h, g in itertools.pairwise(hosts):
        if h.host_id == g.host_id:
            msg = f"plan inputs: host '{h.host_id}' is listed twice; merge its snapshots"
            raise ValidationError(msg)
    demand = {k: inputs.demand[k] for k in sorted(inputs.demand)}
    return PlanInputs(
        now=inputs.now, profiles=profiles, hosts=hosts, demand=demand, policy=inputs.policy
    )


def _sorted_residencies(host: HostSnapshot) -> HostSnapshot:
    ordered = tuple(sorted(host.residencies, key=_res_key))
    if ordered == host.residencies:
        return host
    return msgspec.structs.replace(host, residencies=ordered)


def _res_key(r: ResidencySnapshot) -> tuple[str, str]:
    return (r.model_id, r.state)


def input_digest(inputs: PlanInputs) -> str:
    """SHA-256 (hex) of the canonical JSON encoding of the complete inputs."""
    data = msgspec.json.encode(canonical_inputs(inputs), order="sorted")
    return hashlib.sha256(data).hexdigest()


def plan(inputs: PlanInputs, hooks: PlannerHooks, *, reuse: bool = True) -> Plan:
    """Compute the complete desired placement for one tick.

    Args:
        inputs: profiles, host snapshots, demand, policy and the planning instant.
        hooks: the score terms to sum and the victim selector for staged preemption
            (:meth:`grid_core.plugins.Plugins.planner_hooks`; :data:`NO_HOOKS` for none).
        reuse: return the remembered plan for identical inputs (benchmarks pass ``False``).

    Returns:
        A :class:`Plan`: assignments (kept incumbents included), desired counts, staged
        evictions, unmet constraints and the input digest. Same inputs in any order give the
        same plan.

    Raises:
        ValidationError: duplicate model or host ids.
    """
    topo = lookup(inputs)
    if topo is None:
        first = canonical_inputs(inputs)
        topo = topology_for(inputs, (first.profiles, first.hosts))
    demand = {k: inputs.demand[k] for k in sorted(inputs.demand)}
    canon = msgspec.structs.replace(topo.canon, demand=demand)
    digest = topo.digest(demand)
    key = (digest, id(hooks))
    if reuse and key in _MEMO:
        _MEMO.move_to_end(key)
        return _MEMO[key][1]
    terms = list(hooks.score_terms)
    selector = hooks.victim_selector
    topo.builds += 1
    result = _solve_with_replans(canon, terms, selector, digest, topo)
    if reuse:
        _MEMO[key] = (hooks, result)
        while len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    return result


def _solve_with_replans(
    canon: PlanInputs,
    terms: list[ScoreTerm],
    selector: VictimSelector | None,
    digest: str,
    topo: Topology | None = None,
) -> Plan:
    """Plan once; while demand stays unmet, plan again with prices learned from the binding
    resources of the best plan so far, as long as each re-plan improves (:mod:`.replan`);
    then, if lower-priority models are still short, once more holding room for them from
    the start (:mod:`.holds`), kept only when it improves too; then exchange repair on the
    plan kept, one size-priced candidate (:func:`_size_candidate`), the settling repair for
    what is still short (:mod:`.settle`), the lower-class-aware candidate
    (:func:`_lower_class_candidate`), long ejection chains (:mod:`.longchains`), pair
    exchanges (:mod:`.pairswap`), lower-class displacement (:mod:`.displace`; the chains
    and pair exchanges run again when it placed anything, so the trades start from the plan
    the repairs that only add make and never leave it worse in priority order), split and
    twin trades (:mod:`.split`, :mod:`.twin`), class trades (:mod:`.classtrade`), deeper
    ejection chains with a budget of their own (:func:`.longchains.deep_chains`) and, last,
    on a plan that leaves nothing short, the spare-host moves (:mod:`.spare`)."""
    best = PlanState(canon, terms, selector, topology=topo)
    _solve(best)
    for _ in range(MAX_REPLANS):
        prices = learned_prices(best)
        if prices is None:
            break
        alt = PlanState(canon, terms, selector, shared=best)
        alt.learned = prices
        alt.rival = best
        if not _solve(alt) or not improves(alt, best):
            break
        best = alt
    short = short_models(best)
    if short and not (best.evictions or best.relocations or best.staged):
        # one more plan holding room for what is still short (pure packing only: a hold
        # must never stand in the way of a staged preemption or relocation; see .holds)
        alt = PlanState(canon, terms, selector, shared=best)
        alt.hold_for = sorted(short, key=lambda mi: round_key(best, mi))
        alt.rival = best
        if _solve(alt) and improves(alt, best):
            best = alt
    # On the kept plan only (pure packing): an exchange or a settling move only ever adds
    # a replica.
    if not (best.evictions or best.relocations or best.staged):
        before = class_counts(best)
        exchange_rounds(best)
        best = _size_candidate(canon, terms, selector, best, before)
        settle(best)
        best = _lower_class_candidate(canon, terms, selector, best)
        long_chains(best)
        pair_exchange_rounds(best)
        if displace_rounds(best):
            long_chains(best)
            pair_exchange_rounds(best)
        split_rounds(best)
        twin_rounds(best)
        class_trades(best)
        deep_chains(best)
        keep_spare(best)
    return _result(best, digest)  # reported once, for the plan kept


def _size_candidate(
    canon: PlanInputs,
    terms: list[ScoreTerm],
    selector: VictimSelector | None,
    best: PlanState,
    before: list[int],
) -> PlanState:
    """One more candidate for a plan ``best`` (exchanges done, nothing staged) that leaves
    demand unmet: planned with held room and a size price on hosts without a model-slot
    ceiling (:func:`.replan.size_prices`), exchanges run on it too; it replaces ``best``
    only when it places more and no priority class fewer (:func:`.replan.dominates`).
    ``before`` is ``best``'s replicas per class before its exchanges: the candidate is
    abandoned once a finished class has fewer (its own exchanges come later)."""
    prices = size_prices(best)
    if prices is None:
        return best
    alt = PlanState(canon, terms, selector, shared=best)
    alt.size_price = prices
    alt.hold_for = sorted(short_models(best), key=lambda mi: round_key(best, mi))
    alt.rival = best
    alt.dominate = before
    # Its searches start nearly spent: the candidate is for a different packing, not
    # for more search (see SIZE_CANDIDATE_REPAIR_STEPS).
    alt.repair_steps = max(0, alt.policy.repair_budget - SIZE_CANDIDATE_REPAIR_STEPS)
    alt.chain_steps = CHAIN_PLAN_BUDGET
    if not _solve(alt) or alt.evictions or alt.relocations or alt.staged:
        return best
    exchange_rounds(alt)
    return alt if dominates(alt, best) else best


def _lower_class_candidate(
    canon: PlanInputs,
    terms: list[ScoreTerm],
    selector: VictimSelector | None,
    best: PlanState,
) -> PlanState:
    """One last candidate for a finished plan ``best`` (nothing staged) that still leaves
    models below the top class short: each class's new replicas pay learned prices only for
    the hosts the short models of the classes below it need
    (:func:`.replan.lower_class_prices`), with a stronger slot-fit cost
    (:data:`.replan.LOWER_CLASS_SLOT_FIT_WEIGHT`); exchanges and the settling repair run on
    it too. It replaces ``best`` only when it places more and no priority class fewer
    (:func:`.replan.dominates`). It is abandoned once a finished class above the lowest is
    behind, never in the lowest: there its own exchanges and settling, which run after the
    solve, often lift it past ``best``."""
    if not short_models(best):
        return best
    alt = PlanState(canon, terms, selector, shared=best)
    alt.class_prices = lower_class_prices(best)
    alt.slot_fit_weight = LOWER_CLASS_SLOT_FIT_WEIGHT
    alt.rival = best
    alt.dominate = class_counts(best)
    alt.finish_lowest = True
    if not _solve(alt) or alt.evictions or alt.relocations or alt.staged:
        return best
    exchange_rounds(alt)
    settle(alt)
    return alt if dominates(alt, best) else best


def _solve(state: PlanState) -> bool:
    """Run every phase on ``state``; False when ``state`` is a re-plan that falls behind its
    rival (:func:`grid_core.planner.replan.behind`) and was abandoned."""
    seed_incumbents(state)
    place_pins(state)
    if state.hold_for:
        reserve_holds(state, state.hold_for)
    homogeneous = homogeneous_empty(state)
    classes = sorted({p.priority for p in state.profiles}, reverse=True)
    for prio in classes:
        models = sorted(
            (mi for mi, p in enumerate(state.profiles) if p.priority == prio),
            key=lambda mi: round_key(state, mi),
        )
        state.prepare_scarcity(prio)
        place_class(state, models)
        lift_holds(state, models)
        repair_class(state, models, homogeneous)
        readmit_deferred(state, models)
        preempt_rounds(state, models)
        relocate_for(state, [mi for mi, p in enumerate(state.profiles) if p.priority == prio])
        if state.rival is not None and behind(state, state.rival, prio):
            return False
    # Lower classes have placed since: a last repair pass may move their new replicas to
    # make room for a higher-priority model that is still short.
    everyone = sorted(range(len(state.profiles)), key=lambda mi: round_key(state, mi))
    repair_class(state, everyone, homogeneous)
    mark_make_before_break(state)
    return True


def _result(state: PlanState, digest: str) -> Plan:
    """The plan ``state`` holds, reported."""
    return Plan(
        assignments=tuple(state.assignments()),
        desired={p.model_id: state.reported[mi] for mi, p in enumerate(state.profiles)},
        evictions=tuple(state.evictions),
        unmet=tuple(unmet(state)),
        digest=digest,
        surplus=tuple(surplus_report(state)),
    )
