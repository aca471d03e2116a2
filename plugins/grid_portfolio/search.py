"""Bounded, deterministic joint portfolio search over workload → model maps.

Specification, "Proactive observation and portfolio planning":

1. Start from the evidence-backed choices: each workload's exploitation leader (utility
   without the optimism bonus); at most one distinct model may differ from that map because
   of uncertainty (the fleet's exploration budget, :data:`EXPLORATION_MODELS`).
2. Nominally roomy fleets keep the pressure-first fast path: when the preferred map's plan
   places a replica of every chosen model, it is the answer (one planner evaluation).
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


def _allowed(mapping: Mapping[str, str], exploit: Mapping[str, str], cands: Cands) -> bool:
    """Exploration budget and the one-preemption-only-model rule."""
    explored: set[str] = set()
    preempt_only: set[str] = set()
    for w, m in mapping.items():
        row = next(r for r in cands[w] if r[0] == m)
        lead = next(r for r in cands[w] if r[0] == exploit[w])
        if m != exploit[w] and row[1] - row[2] < lead[1] - lead[2] and row[1] >= lead[1]:
            explored.add(m)  # chosen over the leader only because of its bonus
        if row[3]:
            preempt_only.add(m)
    return len(explored) <= EXPLORATION_MODELS and len(preempt_only) <= PREEMPTION_ONLY_MODELS


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
    order: Sequence[str] = sorted(
        exploit, key=lambda w: (-snapshot.workloads[w].offered_concurrency, w)
    )
    try:
        plan = ctx.evaluate(start)
    except StateError:
        return None
    best, best_plan = start, plan
    if _covered(plan, start) == set(start):
        return _decision(snapshot, best, exploring, "every workload's preferred model fits")
    best_score = objective(plan, best, snapshot, cands)
    try:
        for trial in _consolidations(cands, best):
            if not _allowed(trial, exploit, cands):
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
                    if trial == best or not _allowed(trial, exploit, cands):
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
