"""One tick's portfolio pass: snapshot, search (plugin or built-in), projection, status rows.

Specification, "Proactive observation and portfolio planning". The controller hands this
module immutable inputs (demand and evidence are read once per tick; request observations
queue outside the controller lock and are folded in before the tick, so completions never
wait for the search). Every counterfactual reuses the one :class:`PortfolioSnapshot`; the
search evaluates candidate maps with the real planner within :data:`MAX_PORTFOLIOS`.
Without a ``grid_search_portfolio`` answer, each admitted workload is projected onto its
best usable candidate by exploitation utility (evidence without the optimism bonus).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import msgspec

from grid_core.demand.series import Forecast
from grid_core.demand.types import ModelDemand
from grid_core.errors import GridError, StateError
from grid_core.planner.types import Plan, PlanInputs, PlannerPolicy
from grid_core.portfolio.candidates import candidates_for
from grid_core.portfolio.evidence import OutcomeBook
from grid_core.portfolio.feasibility import PRESENT, SERVING, Fit
from grid_core.portfolio.gate import admit, spare_capacity_proof, workload_demand
from grid_core.portfolio.project import project
from grid_core.portfolio.replace import (
    MAX_PATH_PROOFS,
    carried,
    find_replacement,
    leaving,
    release,
    starvation_paths,
)
from grid_core.portfolio.standby import (
    choose_standby,
    claims,
    displaced,
    leader_of,
    returning,
    with_standby,
)
from grid_core.portfolio.types import (
    MAX_PORTFOLIOS,
    AdmissionRow,
    AdmissionState,
    AdmissionThresholds,
    Candidate,
    PortfolioContext,
    PortfolioDecision,
    PortfolioReport,
    PortfolioSnapshot,
    Replacement,
    StandbyClaim,
    WorkloadDemand,
)
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

PlanOf = Callable[[PlanInputs], Plan]
"""The planner with the tick's hooks bound."""
Search = Callable[[PortfolioSnapshot, "Evaluator"], PortfolioDecision | None]
"""The ``grid_search_portfolio`` hook (first answer) as a callable."""


class Evaluator:
    """Planner-backed evaluation of candidate maps within a budget (a PortfolioContext).

    Args:
        evaluate: mapping → the plan it would produce.
        budget: distinct portfolios allowed (at most :data:`MAX_PORTFOLIOS`).
    """

    def __init__(self, evaluate: Callable[[Mapping[str, str]], Plan], budget: int) -> None:
        self._evaluate = evaluate
        self.budget = min(budget, MAX_PORTFOLIOS)
        self.evaluated = 0
        self._memo: dict[tuple[tuple[str, str], ...], Plan] = {}

    def evaluate(self, mapping: Mapping[str, str]) -> Plan:
        """The plan serving ``mapping`` would produce (a repeated map is free).

        Raises:
            StateError: the budget is spent.
        """
        key = tuple(sorted(mapping.items()))
        got = self._memo.get(key)
        if got is not None:
            return got
        if self.budget <= 0:
            msg = f"portfolio evaluation budget spent ({MAX_PORTFOLIOS} portfolios)"
            raise StateError(msg)
        self.budget -= 1
        self.evaluated += 1
        plan = self._evaluate(mapping)
        self._memo[key] = plan
        return plan


@dataclass(frozen=True)
class TickInputs:
    """What one portfolio pass reads (nothing here is mutated).

    Attributes:
        now: planning instant (Unix seconds).
        profiles: configured profiles sorted by id.
        hosts: host snapshots (in-flight work applied).
        direct: named-model demand by model id.
        forecasts: workload → (forecast, observations in the window).
        outcomes: measured outcome evidence.
        quality: (model, workload) → (labelled score, confidence) of the current revision.
        policy: planner policy; headroom: demand headroom fraction.
        thresholds: the admission gate.
        previous: last tick's report (hysteresis, exploration slot).
    """

    now: float
    profiles: tuple[ModelProfile, ...]
    hosts: tuple[HostSnapshot, ...]
    direct: Mapping[str, ModelDemand]
    forecasts: Mapping[str, tuple[Forecast, int]]
    outcomes: OutcomeBook
    quality: Mapping[tuple[str, str], tuple[float, float]]
    policy: PlannerPolicy
    headroom: float
    thresholds: AdmissionThresholds
    previous: PortfolioReport | None


@dataclass(frozen=True)
class TickPortfolio:
    """The pass's outcome: demand for the authoritative plan and the report (rows pending).

    ``hosts`` are the snapshots the authoritative plan must use: the input's, with the
    victims of the tick's replacement shown leaving their path host
    (:func:`~grid_core.portfolio.replace.leaving`).
    """

    demand: dict[str, ModelDemand]
    report: PortfolioReport
    candidates: dict[str, tuple[Candidate, ...]]
    workloads: dict[str, WorkloadDemand]
    hosts: tuple[HostSnapshot, ...] = ()


def exploitation_choice(cands: tuple[Candidate, ...]) -> str | None:
    """The usable candidate with the best utility without the optimism bonus."""
    usable = [c for c in cands if c.usable]
    if not usable:
        return None
    return min(usable, key=lambda c: (-(c.utility - c.bonus), c.model_id)).model_id


class _TickAdmission:
    """What one tick knows about its workloads before any search: the feasibility scan, the
    admission gate's verdicts, each workload's candidates, and the projection of a
    workload→model map onto model demand (shared by the search, the replacement and the
    standby steps).

    Args:
        inp: the tick's immutable inputs.
    """

    def __init__(self, inp: TickInputs) -> None:
        self.inp = inp
        self.fit = Fit(inp.profiles, inp.hosts, inp.policy, inp.direct)
        raw = {
            w: workload_demand(w, fc, n, inp.profiles, inp.thresholds)
            for w, (fc, n) in sorted(inp.forecasts.items())
        }
        previous = {d.workload: d for d in inp.previous.workloads} if inp.previous else None
        self.workloads = admit(raw, self.fit, previous)
        self.admitted = {w: d for w, d in self.workloads.items() if d.admitted}
        self.candidates = {
            w: candidates_for(w, self.fit, inp.outcomes, inp.quality, inp.now, self.admitted)
            for w in self.workloads
        }
        self.by_id = {p.model_id: p for p in inp.profiles}
        self.capped = frozenset(w for w, d in self.admitted.items() if d.canary_cap)

    def demand_of(self, mapping: Mapping[str, str]) -> dict[str, ModelDemand]:
        """Model demand when the admitted workloads are served as ``mapping`` says (a
        canary-capped workload stays capped until its model has a validated response)."""
        inp, by_id = self.inp, self.by_id
        valid = {w: m for w, m in mapping.items() if w in self.admitted and m in by_id}
        cap = frozenset(
            w
            for w in self.capped
            if w in valid
            and not inp.outcomes.validated(valid[w], w, by_id[valid[w]].artifact_sha256, inp.now)
        )
        return project(inp.direct, self.admitted, valid, by_id, inp.headroom, cap)

    def candidates_of(self, w: str) -> tuple[Candidate, ...]:
        """A workload's candidates (also for one the gate did not admit this tick)."""
        got = self.candidates.get(w)
        if got is None:
            inp = self.inp
            got = candidates_for(w, self.fit, inp.outcomes, inp.quality, inp.now, self.admitted)
        return got

    def snapshot(self) -> PortfolioSnapshot:
        """The immutable snapshot every counterfactual of the tick reuses."""
        inp = self.inp
        return PortfolioSnapshot(
            now=inp.now,
            workloads=self.admitted,
            profiles=inp.profiles,
            hosts=inp.hosts,
            direct=dict(inp.direct),
            candidates={w: self.candidates[w] for w in self.admitted},
            previous=dict(inp.previous.mapping) if inp.previous else {},
            exploring=inp.previous.exploring if inp.previous else None,
            out_hosts=tuple(sorted(self.fit.out_hosts())),
        )


def _decide(
    tick: _TickAdmission, search: Search | None, plan_of: PlanOf, plugin_name: str
) -> tuple[PortfolioDecision, str, int]:
    """Ask the installed search for a workload→model map, else project each admitted
    workload onto its best usable candidate.

    Returns:
        ``(decision, answering plugin's name, portfolios evaluated)``.
    """
    inp = tick.inp

    def evaluate(mapping: Mapping[str, str]) -> Plan:
        return plan_of(
            PlanInputs(
                now=inp.now,
                profiles=inp.profiles,
                hosts=inp.hosts,
                demand=tick.demand_of(mapping),
                policy=inp.policy,
            )
        )

    ctx = Evaluator(evaluate, MAX_PORTFOLIOS)
    if search is not None and tick.admitted:
        decision = search(tick.snapshot(), ctx)
        if decision is not None:
            return decision, plugin_name, ctx.evaluated
    mapping = {}
    for w in tick.admitted:
        best = exploitation_choice(tick.candidates[w])
        if best is not None:
            mapping[w] = best
    decision = PortfolioDecision(mapping=mapping, reason="best usable candidate per workload")
    return decision, "builtin-projection", ctx.evaluated


def run_portfolio(
    inp: TickInputs, search: Search | None, plan_of: PlanOf, plugin_name: str = "plugin"
) -> TickPortfolio:
    """Build the snapshot, ask the search (or project), and return the tick's demand.

    Args:
        inp: the tick's immutable inputs.
        search: the ``grid_search_portfolio`` hook, or ``None`` for the built-in projection
            (no proactive planning: no standby either).
        plan_of: the planner with the tick's hooks bound.
        plugin_name: the answering plugin's name (status).
    """
    tick = _TickAdmission(inp)
    decision, plugin, evaluated = _decide(tick, search, plan_of, plugin_name)
    admitted, candidates = tick.admitted, tick.candidates
    mapping = {w: m for w, m in decision.mapping.items() if w in admitted and m in tick.by_id}
    demand = tick.demand_of(mapping)
    mapping, demand, replacing = _replacement(
        inp, tick.fit, mapping, admitted, candidates, demand, tick.demand_of, plan_of
    )
    standby: dict[str, str] = {}
    standing: dict[str, StandbyClaim] = {}
    standby_note = "no portfolio search: workloads wait for the admission gate"
    planning = leaving(inp.hosts, replacing)
    if search is not None:  # a portfolio search is installed: the proactive planner
        demand, standby, standing, standby_note = fill_standby(
            replace(inp, hosts=planning),
            tick.fit,
            demand,
            tick.workloads,
            tick.candidates_of,
            plan_of,
        )
    report = PortfolioReport(
        plugin=plugin,
        mapping=mapping,
        models=sorted(set(mapping.values())),
        deferred=sorted(w for w in admitted if w not in mapping),
        exploring=decision.exploring,
        evaluated=evaluated,
        reason=decision.reason,
        thresholds=inp.thresholds,
        workloads=list(tick.workloads.values()),
        candidates=[c for w in sorted(candidates) for c in candidates[w]],
        replacing=replacing,
        standby=standby,
        standby_reason=standby_note,
        standby_claims=standing,
    )
    return TickPortfolio(
        demand=demand,
        report=report,
        candidates=candidates,
        workloads=tick.workloads,
        hosts=planning,
    )


def _replacement(
    inp: TickInputs,
    fit: Fit,
    mapping: dict[str, str],
    admitted: Mapping[str, WorkloadDemand],
    candidates: Mapping[str, tuple[Candidate, ...]],
    demand: dict[str, ModelDemand],
    demand_of: Callable[[Mapping[str, str]], dict[str, ModelDemand]],
    plan_of: PlanOf,
) -> tuple[dict[str, str], dict[str, ModelDemand], Replacement | None]:
    """The tick's map, demand and replacement once speculative capacity may give way.

    A replacement in progress (:func:`~grid_core.portfolio.replace.carried`) is finished
    first: a starvation path is proven again, a 1.5x path is proven again while its victims
    stay removable. Otherwise stale speculative capacity gives way (the 1.5x rule), and only
    when no such path is proven may an excess replica of an active model end starvation.
    """
    by_id = {p.model_id: p for p in inp.profiles}
    previous = carried(
        inp.previous.replacing if inp.previous else None,
        mapping,
        inp.hosts,
        fit.out_hosts(),
        fit.degraded_pairs(),
    )
    replacing = None
    if previous is None or previous.rule != "starvation":
        # A carried 1.5x path is proven again and kept, or given up; none: look for one.
        mapping, demand, replacing = _pressure_replacement(
            inp, fit, mapping, admitted, candidates, demand_of, plan_of, previous
        )
        previous = None
    if replacing is None:
        replacing = _end_starvation(inp, fit, mapping, admitted, demand, plan_of, previous)
        if replacing is not None:
            demand = release(demand, replacing, by_id, inp.hosts)
    return mapping, demand, replacing


def fill_standby(
    inp: TickInputs,
    fit: Fit,
    demand: dict[str, ModelDemand],
    workloads: Mapping[str, WorkloadDemand],
    candidates_of: Callable[[str], tuple[Candidate, ...]],
    plan_of: PlanOf,
) -> tuple[dict[str, ModelDemand], dict[str, str], dict[str, StandbyClaim], str]:
    """The tick's demand with standby added, the standby map, the standing standby decisions
    (:func:`~grid_core.portfolio.standby.claims`) and a one-line reason.

    Plans the real demand, lets :func:`~grid_core.portfolio.standby.choose_standby` fill the
    idle hosts, and keeps the result only when the plan with standby places every real
    model as often as the real plan did (two planner evaluations; the second is the
    authoritative plan when no prediction is added, so the controller reuses it).
    """

    def leader(w: str) -> str | None:
        got = leader_of(candidates_of(w))
        return got.model_id if got is not None else None

    before = inp.previous.standby_claims if inp.previous else {}
    present = frozenset(r.model_id for h in inp.hosts for r in h.residencies if r.state in PRESENT)
    claimed = claims(before, {}, workloads, leader, inp.now, present)
    real = _plan(inp, plan_of, demand)
    chosen, why = choose_standby(
        real, fit, workloads, candidates_of, returning(claimed, fit, inp.now)
    )
    standing = claims(claimed, chosen, workloads, leader, inp.now, present)
    if not chosen:
        return demand, {}, standing, f"no standby: {why}"
    trial_demand = with_standby(demand, chosen)
    lost = displaced(real, _plan(inp, plan_of, trial_demand), set(chosen.values()))
    if lost:
        return demand, {}, standing, f"standby withdrawn: it would displace {', '.join(lost)}"
    models = sorted(set(chosen.values()))
    return trial_demand, chosen, standing, f"{len(models)} model(s) stand by on idle capacity"


def _keeps_victim(plan: Plan, rep: Replacement) -> bool:
    """Whether ``plan`` keeps a victim of ``rep`` on its path host (the path is not proven)."""
    return any(a.host_id == rep.host_id and a.model_id in rep.victims for a in plan.assignments)


def _keeps_floor(plan: Plan, rep: Replacement) -> bool:
    """Whether ``plan`` still places every victim of a starvation path on another host (the
    one protected copy; the plan sees the path host's replica leaving)."""
    return all(set(plan.hosts_of(v)) - {rep.host_id} for v in rep.victims)


def _plan(
    inp: TickInputs,
    plan_of: PlanOf,
    demand: dict[str, ModelDemand],
    hosts: tuple[HostSnapshot, ...] | None = None,
) -> Plan:
    """The plan of ``demand`` on ``hosts`` (default: the tick's snapshots)."""
    return plan_of(
        PlanInputs(
            now=inp.now,
            profiles=inp.profiles,
            hosts=inp.hosts if hosts is None else hosts,
            demand=demand,
            policy=inp.policy,
        )
    )


def structural_fit(inp: TickInputs, mapping: Mapping[str, str], plan_of: PlanOf) -> bool:
    """Whether a clean plan (no managed residents) hosts one replica of every chosen model
    beside baselines, pins and directly named demand (specification: "a clean structural
    plan proves the recovered fleet can host one preferred model per active workload")."""
    by_id = {p.model_id: p for p in inp.profiles}
    clean = tuple(
        msgspec.structs.replace(h, residencies=tuple(r for r in h.residencies if not r.actuatable))
        for h in inp.hosts
    )
    demand: dict[str, ModelDemand] = {}
    for m, d in inp.direct.items():
        p = by_id.get(m)
        if p is not None and (d.request_rate_rps > 0 or p.min_replicas > 0 or p.pins):
            want = max(p.min_replicas, d.desired_replicas - d.held_replicas)
            demand[m] = msgspec.structs.replace(d, desired_replicas=want, held_replicas=0)
    chosen = sorted(set(mapping.values()))
    for m in chosen:
        if m not in demand or demand[m].desired_replicas < 1:
            demand[m] = ModelDemand(model_id=m, desired_replicas=1, direct=True)
    plan = plan_of(
        PlanInputs(
            now=inp.now, profiles=inp.profiles, hosts=clean, demand=demand, policy=inp.policy
        )
    )
    return all(plan.hosts_of(m) for m in chosen)


def _end_starvation(
    inp: TickInputs,
    fit: Fit,
    mapping: Mapping[str, str],
    admitted: Mapping[str, WorkloadDemand],
    demand: dict[str, ModelDemand],
    plan_of: PlanOf,
    previous: Replacement | None,
) -> Replacement | None:
    """The first ranked starvation path the planner proves, or ``previous`` (last tick's,
    still in progress) when its path is still proven; ``None`` when no workload starves or
    no path is proven."""
    by_id = {p.model_id: p for p in inp.profiles}
    if previous is not None:
        tries = [previous]
    else:
        paths = starvation_paths(mapping, admitted, fit)
        if not paths or not structural_fit(inp, mapping, plan_of):
            return None
        tries = paths[:MAX_PATH_PROOFS]
    for rep in tries:
        released = release(demand, rep, by_id, inp.hosts)
        plan = _plan(inp, plan_of, released, leaving(inp.hosts, rep))
        if not _keeps_victim(plan, rep) and _keeps_floor(plan, rep):
            return rep
    return None


def _pressure_replacement(
    inp: TickInputs,
    fit: Fit,
    mapping: dict[str, str],
    admitted: Mapping[str, WorkloadDemand],
    candidates: Mapping[str, tuple[Candidate, ...]],
    demand_of: Callable[[Mapping[str, str]], dict[str, ModelDemand]],
    plan_of: PlanOf,
    carried_path: Replacement | None = None,
) -> tuple[dict[str, str], dict[str, ModelDemand], Replacement | None]:
    """The 1.5x mature-beneficiary replacement, when the planner proves its path.

    ``carried_path`` is last tick's replacement still in progress: it is proven again and
    kept while its victims stay removable — no direct demand, pin or baseline since, and on
    the path host each is already draining or still idle (a victim that took traffic again
    is an active canary, which speculative demand never evicts); otherwise no replacement
    this tick. Without it the ranked paths are searched afresh.
    """
    by_id = {p.model_id: p for p in inp.profiles}
    demand = demand_of(mapping)
    protected = frozenset(m for m in by_id if fit.protected(m))
    if carried_path is not None:
        ok = not protected & set(carried_path.victims) and _victims_idle(inp, carried_path)
        replacing = carried_path if ok else None
    else:
        replacing = find_replacement(mapping, admitted, candidates, inp.hosts, protected)
    if replacing is None:
        return mapping, demand, None
    kept = {w: m for w, m in mapping.items() if m not in replacing.victims}
    released = release(demand_of(kept), replacing, by_id, inp.hosts)
    proof = _plan(inp, plan_of, released, leaving(inp.hosts, replacing))
    if _keeps_victim(proof, replacing) or not _waits(proof, replacing):
        # The planner keeps the victim there, or nothing of the beneficiary waits for the
        # freed host: no proven path.
        return mapping, demand, None
    return kept, released, replacing


def _waits(plan: Plan, rep: Replacement) -> bool:
    """Whether ``plan`` (the victims leaving the path host) still wants a replica of the
    beneficiary it cannot place yet, or places one on the path host: only then does the
    freed host serve the beneficiary."""
    if any(a.model_id == rep.beneficiary and a.host_id == rep.host_id for a in plan.assignments):
        return True
    return any(u.model_id == rep.beneficiary and u.missing > 0 for u in plan.unmet)


def _victims_idle(inp: TickInputs, rep: Replacement) -> bool:
    """Whether every victim of ``rep`` on its path host is draining already or idle."""
    host = next((h for h in inp.hosts if h.host_id == rep.host_id), None)
    if host is None:
        return False
    for r in host.residencies:
        if r.model_id in rep.victims and r.state != "draining" and r.active_requests != 0:
            return False
    return True


def _row_for(
    d: WorkloadDemand, state: AdmissionState, reason: str, **counts: int | float | str
) -> AdmissionRow:
    return msgspec.convert(
        {
            "workload": d.workload,
            "state": state,
            "reason": reason,
            "offered_concurrency": round(d.offered_concurrency, 4),
            "observations": d.observations,
            **counts,
        },
        AdmissionRow,
    )


def _unplanned_state(m: str, c: Candidate | None, plan: Plan) -> tuple[AdmissionState, str]:
    if c is not None and c.preemption_paths and not c.feasible_now:
        return "blocked-by-residency", (
            f"{m} waits for idle speculative residents on {c.preemption_paths[0]} to drain"
        )
    if c is not None and c.compatible_hosts:
        unmet = next((u.message for u in plan.unmet if u.model_id == m), "no headroom now")
        return "capacity-contended", f"{m}: {unmet}"
    return "infeasible", f"no live host can hold {m}"


def _undersupplied(m: str, ready: int, desired: int, planned: int, plan: Plan) -> str:
    """Why a workload's model has fewer ready replicas than desired: the plan's own reason
    for the replicas it could not place (e.g. the memory other work holds, which workload
    demand may not take), or how many placed replicas are still on their way."""
    why = f"{ready} of {desired} replicas of {m} ready"
    if planned < desired:
        unmet = next((u.message for u in plan.unmet if u.model_id == m), "no headroom now")
        why += f"; {unmet}"
    if planned > ready:
        why += f"; {planned - ready} more planned"
    return why


def admission_rows(
    tick: TickPortfolio, plan: Plan, hosts: Mapping[str, HostSnapshot], fit: Fit
) -> list[AdmissionRow]:
    """One row per active unbound workload, explaining the authoritative plan (no solver).

    Specification, "Proactive observation and portfolio planning": a workload below the
    admission gate waits for a plan, an admitted one without a chosen model is deferred or
    infeasible, and a chosen model's row counts its desired, planned and ready replicas.
    """
    rows = []
    for w, d in sorted(tick.workloads.items()):
        if not d.admitted:
            rows.append(_awaiting_row(tick.report, d, fit))
        elif w not in tick.report.mapping:
            rows.append(_unmapped_row(tick.report, d, tick.candidates.get(w, ())))
        else:
            rows.append(_mapped_row(tick, d, plan, hosts, fit))
    return rows


def _awaiting_row(rep: PortfolioReport, d: WorkloadDemand, fit: Fit) -> AdmissionRow:
    """The row of a workload still below the admission gate (its evidence against the bar)."""
    why = (
        f"below the admission gate: {d.observations}/{rep.thresholds.observations} "
        f"observations, {d.offered_concurrency:.2f}/{rep.thresholds.concurrency} "
        "offered-concurrency units"
    )
    if d.admission == "weak_media":
        why += f"; media canary refused: {spare_capacity_proof(fit, d.workload)}"
    if d.workload in rep.standby:
        why += f"; {rep.standby[d.workload]} stands by on idle capacity"
    return _row_for(d, "awaiting-plan", why)


def _unmapped_row(
    rep: PortfolioReport, d: WorkloadDemand, cands: tuple[Candidate, ...]
) -> AdmissionRow:
    """The row of an admitted workload the portfolio serves with no model this tick."""
    swap = rep.replacing
    if swap is not None and any(c.model_id in swap.victims and c.resident for c in cands):
        why = (
            f"deferred: its model gives way on {swap.host_id} to {swap.beneficiary} "
            f"for {swap.workload} (pressure {swap.pressure:.2f} >= 1.5 x "
            f"{swap.victim_pressure:.2f})"
        )
        return _row_for(d, "deferred", why)
    if any(c.usable for c in cands):
        return _row_for(d, "deferred", f"deferred under current capacity: {rep.reason}")
    rejection = cands[0].rejection if cands else None
    return _row_for(d, "infeasible", rejection or "no configured model scores it")


def _mapped_row(
    tick: TickPortfolio,
    d: WorkloadDemand,
    plan: Plan,
    hosts: Mapping[str, HostSnapshot],
    fit: Fit,
) -> AdmissionRow:
    """The row of a workload with a chosen model: how far its replicas are from serving.

    A ready replica on a throttled host where one of the model's requests outlasts the
    protection grace (:meth:`~grid_core.portfolio.feasibility.Fit.degraded`) is not counted
    as ready: the planner does not count it either, and the row names the host instead."""
    rep = tick.report
    m = rep.mapping[d.workload]
    c = next((c for c in tick.candidates.get(d.workload, ()) if c.model_id == m), None)
    desired = plan.desired.get(m, 0)
    planned = len(plan.hosts_of(m))
    degraded = fit.degraded_pairs()
    ready = starting = 0
    stranded: list[str] = []
    for h in hosts.values():
        r = h.residency(m)
        if r is not None and r.state == "ready" and (h.host_id, m) in degraded:
            stranded.append(h.host_id)
        elif r is not None and r.state == "ready":
            ready += 1
        elif r is not None and r.state in SERVING:
            starting += 1
    staged = any(e.beneficiary == m for e in plan.evictions)
    state: AdmissionState
    if ready and ready >= desired:
        state, why = "ready", f"{ready} ready replica(s) of {m}"
    elif ready:
        state, why = "undersupplied", _undersupplied(m, ready, desired, planned, plan)
    elif starting:
        state, why = "starting", f"{m} is loading or warming"
    elif planned or staged:
        after = " after a staged preemption" if staged else ""
        state, why = "planned", f"{m} planned on {planned} host(s){after}"
    elif rep.replacing is not None and rep.replacing.beneficiary == m:
        state = "blocked-by-residency"
        why = (
            f"{m} replaces idle speculative {','.join(rep.replacing.victims)} on "
            f"{rep.replacing.host_id}: drain first, then load"
        )
    else:
        state, why = _unplanned_state(m, c, plan)
    if stranded:
        why += (
            f"; not counted as ready: {m} on {', '.join(sorted(stranded))} (throttled; one "
            "request would outlast the protection grace)"
        )
    return _row_for(
        d,
        state,
        why,
        model_id=m,
        desired=desired,
        planned=planned,
        ready=ready,
        missing=max(0, desired - ready),
        eligible_hosts=c.compatible_hosts if c else 0,
        startup_s=c.startup_s if c else 0.0,
    )


class SearchSource(Protocol):
    """Whatever answers ``grid_search_portfolio`` (the plugin facade does)."""

    def search_portfolio(
        self, snapshot: PortfolioSnapshot, ctx: PortfolioContext
    ) -> PortfolioDecision | None:
        """The first portfolio search's decision, or ``None``."""
        ...


class PortfolioPass:
    """The controller's portfolio part: evidence, the gate and the last report.

    Args:
        source: the plugin facade (``None``: no search installed, built-in projection).
        plugin_name: name of the answering plugin (status).
        warn: receives a one-line warning when the search fails.

    Attributes:
        outcomes: measured outcome evidence (durable).
        thresholds: the admission gate (durable).
        last: the last tick's report with its admission rows.
    """

    def __init__(
        self, source: SearchSource | None, plugin_name: str, warn: Callable[[str], None]
    ) -> None:
        self.source = source
        self.plugin_name = plugin_name
        self.warn = warn
        self.outcomes = OutcomeBook()
        self.thresholds = AdmissionThresholds()
        self.last: PortfolioReport | None = None

    def _search(self, snapshot: PortfolioSnapshot, ctx: Evaluator) -> PortfolioDecision | None:
        if self.source is None:
            return None
        try:
            return self.source.search_portfolio(snapshot, ctx)
        except GridError as exc:  # a failing search never stops planning
            self.warn(f"portfolio search failed: {exc}")
            return None

    def run(self, inp: TickInputs, plan_of: PlanOf) -> TickPortfolio:
        """One pass (see :func:`run_portfolio`)."""
        search = self._search if self.source is not None else None
        return run_portfolio(inp, search, plan_of, self.plugin_name)

    def finish(
        self, tick: TickPortfolio, plan: Plan, hosts: Mapping[str, HostSnapshot], fit: Fit
    ) -> PortfolioReport:
        """Attach the admission rows explaining the authoritative ``plan``; keep the report."""
        self.last = msgspec.structs.replace(
            tick.report, admissions=admission_rows(tick, plan, hosts, fit)
        )
        return self.last
