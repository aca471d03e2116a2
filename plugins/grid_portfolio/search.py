"""Bounded, deterministic joint portfolio search over workload → model maps.

Specification, "Proactive observation and portfolio planning":

1. Start from the evidence-backed choices: each workload's exploitation leader (utility
   without the optimism bonus); at most one distinct model may differ from that map because
   of uncertainty (the fleet's exploration budget, :data:`EXPLORATION_MODELS`). The start
   obeys the one-preemption-only-model rule too, as far as its workloads have another
   candidate (:func:`_within_preemption_budget`): every later trial changes one workload at
   a time, so a start holding several preemption-only leaders would leave no allowed trial
   and freeze the search there.
2. Nominally roomy fleets keep the pressure-first fast path: when the preferred map's plan
   places a replica of every chosen model, it is the answer (one planner evaluation). A
   temporary outage does not switch that policy: while hosts are out
   (``snapshot.out_hosts``), a preferred map whose distinct models fit the nominal fleet's
   model slots (:func:`_nominally_roomy`) is still the answer, and the planner places what
   the live hosts can hold by pressure until the hosts return.
3. Otherwise (a scarce fleet) run a coordinate search over complete maps — one workload's
   model changed at a time, deferral included — plus a subset search that consolidates
   workloads onto shared models, ranked by cheap set coverage before the planner verifies
   them. Every candidate map is evaluated by the authoritative planner through
   ``ctx.evaluate`` within the controller's budget (at most 64 portfolios) and compared by
   the scarce-fleet objective (:func:`objective`).
4. A map may introduce at most one preemption-only model (:data:`PREEMPTION_ONLY_MODELS`),
   and a model earns coverage only when the evaluated plan places it or stages its victim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grid_core.api import (
    Plan,
    PortfolioContext,
    PortfolioDecision,
    PortfolioSnapshot,
    StateError,
)

EXPLORATION_MODELS = 1
"""Distinct models that may differ from the exploitation-only map because of uncertainty
(specification: "an explicit fleet exploration budget, not one canary allowance per
workload")."""
PREEMPTION_ONLY_MODELS = 1
"""Preemption-only models one map may introduce per control tick (specification)."""
MAX_PASSES = 3
"""Coordinate-search passes over the workloads; the 64-portfolio budget bounds them anyway,
and three passes settle every map seen on the lab fleets."""
SUBSET_TRIALS = 8
"""Consolidation maps tried by the subset search (ranked by cheap set coverage first)."""

Objective = tuple[float, ...]
Cands = dict[str, list[tuple[str, float, float, bool]]]
"""workload → [(model id, utility, bonus, preemption-only)], best utility first."""


def _candidates(snapshot: PortfolioSnapshot) -> Cands:
    out: Cands = {}
    for w in snapshot.workloads:
        rows = [c for c in snapshot.candidates.get(w, ()) if c.usable]
        out[w] = [
            (c.model_id, c.utility, c.bonus, not c.resident and not c.feasible_now) for c in rows
        ]
    return out


def _exploit(cands: Cands) -> dict[str, str]:
    return {
        w: min(rows, key=lambda r: (-(r[1] - r[2]), r[0]))[0] for w, rows in cands.items() if rows
    }


def _explore(cands: Cands, exploit: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """The exploitation map with at most one model swapped in for its optimism bonus."""
    best: tuple[float, str] | None = None
    for w, rows in cands.items():
        top = min(rows, key=lambda r: (-r[1], r[0])) if rows else None
        if top is None or top[0] == exploit.get(w) or top[3]:
            continue  # uncertainty never buys a preemption
        gain = top[1] - next(r[1] for r in rows if r[0] == exploit[w])
        if best is None or (gain, top[0]) > best:
            best = (gain, top[0])
    if best is None:
        return dict(exploit), None
    model = best[1]
    out = dict(exploit)
    for w, rows in cands.items():
        top = min(rows, key=lambda r: (-r[1], r[0])) if rows else None
        if top is not None and top[0] == model:
            out[w] = model
    return out, model


def _pressure_behind(model: str, mapping: Mapping[str, str], snapshot: PortfolioSnapshot) -> float:
    """Offered concurrency (units) of the workloads ``mapping`` sends to ``model``."""
    wl = snapshot.workloads
    return sum(wl[w].offered_concurrency for w, m in mapping.items() if m == model and w in wl)


def _preempt_only(w: str, m: str, cands: Cands) -> bool:
    """Whether ``m`` could serve ``w`` only through a preemption (not resident, no headroom)."""
    return any(r[0] == m and r[3] for r in cands[w])


def _preempt_only_models(mapping: Mapping[str, str], cands: Cands) -> set[str]:
    """The preemption-only models of ``mapping``."""
    return {m for w, m in mapping.items() if _preempt_only(w, m, cands)}


def _within_preemption_budget(
    mapping: Mapping[str, str], cands: Cands, snapshot: PortfolioSnapshot
) -> dict[str, str]:
    """``mapping`` with as few preemption-only models as its workloads allow.

    The :data:`PREEMPTION_ONLY_MODELS` preemption-only models with the most offered
    concurrency behind them (then the most workloads, then the model id) stay; every other
    workload mapped to a preemption-only model moves to its best candidate that is resident
    or fits now (utility without the bonus). A workload with no such candidate keeps its
    model: it is the workload's only option, and as projected demand it only fills capacity
    that frees up (it never evicts), so deferring it would only drop that chance.
    Specification: a joint portfolio introduces at most one preemption-only model per
    control tick.

    Args:
        mapping: workload → model id (every model one of the workload's candidates).
        cands: the candidate rows (:data:`Cands`).
        snapshot: the search's snapshot (offered concurrency per workload).

    Returns:
        A new map (workload → model id) over the same workloads.
    """
    ranked = sorted(
        _preempt_only_models(mapping, cands),
        key=lambda m: (
            -_pressure_behind(m, mapping, snapshot),
            -sum(1 for v in mapping.values() if v == m),
            m,
        ),
    )
    keep = set(ranked[:PREEMPTION_ONLY_MODELS])
    out: dict[str, str] = {}
    for w, m in mapping.items():
        out[w] = m
        if m in keep or not _preempt_only(w, m, cands):
            continue
        usable = [r for r in cands[w] if not r[3]]
        if usable:
            out[w] = min(usable, key=lambda r: (-(r[1] - r[2]), r[0]))[0]
    return out


def _nominally_roomy(snapshot: PortfolioSnapshot, mapping: Mapping[str, str]) -> bool:
    """Whether the nominal fleet — every known host, those out right now included — has a
    model slot for each distinct model of ``mapping`` (a host without a model ceiling counts
    as room for all of them). Slots only: a roomy fleet's plan then settles memory by
    pressure, as the fast path does."""
    need = len(set(mapping.values()))
    slots = 0
    for h in snapshot.hosts:
        slots += h.max_models if h.max_models > 0 else need
    return slots >= need


def _covered(plan: Plan, mapping: Mapping[str, str]) -> set[str]:
    placed = {a.model_id for a in plan.assignments}
    staged = {e.beneficiary for e in plan.evictions if e.beneficiary}
    return {w for w, m in mapping.items() if m in placed or m in staged}


def objective(
    plan: Plan, mapping: Mapping[str, str], snapshot: PortfolioSnapshot, cands: Cands
) -> Objective:
    """The scarce-fleet objective, compared lexicographically (larger is better).

    Order (specification): direct and baseline work first (replicas short of their desired
    count), distinct admitted workload coverage, recent measured failure restored, covered
    offered concurrency, spare model slots kept (fewer distinct models), fewer missing
    replicas, then measured utility and fewer new replicas (transition cost).
    """
    short = 0
    for mid, d in snapshot.direct.items():
        if d.direct or d.desired_replicas:
            own = d.desired_replicas - d.held_replicas
            short += max(0, own - len(plan.hosts_of(mid)))
    covered = _covered(plan, mapping)
    wl = snapshot.workloads
    failure = sum(wl[w].failure_rate for w in covered)
    pressure = sum(wl[w].offered_concurrency for w in covered)
    models = {mapping[w] for w in covered}
    missing = sum(u.missing for u in plan.unmet if u.model_id in models)
    utility = 0.0
    for w in covered:
        utility += next((r[1] for r in cands[w] if r[0] == mapping[w]), 0.0)
    new = sum(1 for a in plan.assignments if not a.incumbent and a.model_id in models)
    return (
        -float(short),
        float(len(covered)),
        round(failure, 3),
        round(pressure, 3),
        -float(len(models)),
        -float(missing),
        round(utility, 3),
        -float(new),
    )


def _allowed(
    mapping: Mapping[str, str],
    exploit: Mapping[str, str],
    cands: Cands,
    limit: int = PREEMPTION_ONLY_MODELS,
) -> bool:
    """Exploration budget and the preemption-only rule: at most ``limit`` preemption-only
    models (:data:`PREEMPTION_ONLY_MODELS`, or the start's count when workloads without
    another candidate leave more there, so a step may not add one)."""
    explored: set[str] = set()
    preempt_only: set[str] = set()
    for w, m in mapping.items():
        row = next(r for r in cands[w] if r[0] == m)
        lead = next(r for r in cands[w] if r[0] == exploit[w])
        if m != exploit[w] and row[1] - row[2] < lead[1] - lead[2] and row[1] >= lead[1]:
            explored.add(m)  # chosen over the leader only because of its bonus
        if row[3]:
            preempt_only.add(m)
    return len(explored) <= EXPLORATION_MODELS and len(preempt_only) <= limit


def _consolidations(cands: Cands, base: Mapping[str, str]) -> list[dict[str, str]]:
    """Maps that move every workload a shared model can serve onto it, ranked by coverage."""
    serves: dict[str, list[str]] = {}
    for w, rows in cands.items():
        for m, _, _, preempt in rows:
            if not preempt:
                serves.setdefault(m, []).append(w)
    trials = []
    for m, ws in serves.items():
        if len(ws) < 2:
            continue
        trial = dict(base)
        for w in ws:
            trial[w] = m
        trials.append((len(set(trial.values())), -len(ws), m, trial))
    trials.sort(key=lambda t: (t[0], t[1], t[2]))
    return [t[3] for t in trials[:SUBSET_TRIALS]]


def search(snapshot: PortfolioSnapshot, ctx: PortfolioContext) -> PortfolioDecision | None:
    """The portfolio for this tick (see the module docstring), deterministic in its inputs."""
    cands = _candidates(snapshot)
    exploit = _exploit(cands)
    if not exploit:
        return PortfolioDecision(
            mapping={}, deferred=tuple(sorted(snapshot.workloads)), reason="no usable candidate"
        )
    start, exploring = _explore(cands, exploit)
    start = _within_preemption_budget(start, cands, snapshot)
    limit = max(PREEMPTION_ONLY_MODELS, len(_preempt_only_models(start, cands)))
    order: Sequence[str] = sorted(
        exploit, key=lambda w: (-snapshot.workloads[w].offered_concurrency, w)
    )
    try:
        plan = ctx.evaluate(start)
    except StateError:
        return None
    best, best_plan = start, plan
    if _covered(plan, start) == set(exploit):
        return _decision(snapshot, best, exploring, "every workload's preferred model fits")
    if snapshot.out_hosts and _nominally_roomy(snapshot, start):
        why = f"nominally roomy fleet, {len(snapshot.out_hosts)} host(s) out: policy unchanged"
        return _decision(snapshot, best, exploring, why)
    best_score = objective(plan, best, snapshot, cands)
    try:
        for trial in _consolidations(cands, best):
            if not _allowed(trial, exploit, cands, limit):
                continue
            p = ctx.evaluate(trial)
            s = objective(p, trial, snapshot, cands)
            if s > best_score:
                best, best_plan, best_score = trial, p, s
        for _ in range(MAX_PASSES):
            improved = False
            for w in order:
                for alt in [r[0] for r in cands[w]] + [None]:
                    trial = dict(best)
                    if alt is None:
                        trial.pop(w, None)
                    else:
                        trial[w] = alt
                    if trial == best or not _allowed(trial, exploit, cands, limit):
                        continue
                    p = ctx.evaluate(trial)
                    s = objective(p, trial, snapshot, cands)
                    if s > best_score:
                        best, best_plan, best_score, improved = trial, p, s, True
            if not improved:
                break
    except StateError:
        pass  # budget spent: answer with the best map found
    covered = _covered(best_plan, best)
    return _decision(
        snapshot,
        best,
        exploring,
        f"scarce fleet: {len(covered)} of {len(snapshot.workloads)} workloads covered",
    )


def _decision(
    snapshot: PortfolioSnapshot, mapping: dict[str, str], exploring: str | None, reason: str
) -> PortfolioDecision:
    return PortfolioDecision(
        mapping=mapping,
        deferred=tuple(sorted(w for w in snapshot.workloads if w not in mapping)),
        exploring=exploring if exploring in mapping.values() else None,
        reason=reason,
    )
