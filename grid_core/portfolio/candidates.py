"""Candidate rows: every model a workload could use, with fit, evidence and a utility.

Specification, "Proactive observation and portfolio planning". Utility is in points:
configured suitability (100 points for a perfect score) blended toward labelled quality as
its confidence grows, minus measured failure weighted by outcome confidence, plus the
decaying optimism bonus, minus a bounded transition penalty (cold start; a larger one when
only a preemption path exists). The bonus (at most 6) and the penalty (at most 8 for a cold
start) are both smaller than a meaningful suitability difference (10 points, a 0.1 score
step), so neither uncertainty nor residency overrides configured fitness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from grid_core.portfolio.evidence import OutcomeBook, optimism_bonus
from grid_core.portfolio.feasibility import Fit
from grid_core.portfolio.types import MAX_CANDIDATES, Candidate

SUITABILITY_POINTS = 100.0
"""Points of a perfect configured suitability (1.0)."""
FAILURE_POINTS = 40.0
"""Points a fully confident, always-failing outcome record costs: a broken model loses to
any reasonably suitable peer."""
MAX_TRANSITION_POINTS = 8.0
"""Ceiling of the cold-start penalty: bounded so startup never overwhelms quality or
suitability (specification: "a bounded transition penalty")."""
STARTUP_S_PER_POINT = 15.0
"""Cold-start seconds per penalty point (a two-minute start costs the full 8 points)."""
PREEMPTION_POINTS = 12.0
"""Extra penalty of a candidate without current headroom (it needs a preemption path or a
drain first): larger than the optimism bonus, so uncertainty can spend spare capacity but
never manufacture eviction authority."""


def candidates_for(
    workload: str,
    fit: Fit,
    outcomes: OutcomeBook,
    quality: Mapping[tuple[str, str], tuple[float, float]],
    now: float,
    active: Iterable[str],
) -> tuple[Candidate, ...]:
    """Ranked candidates of one workload: at most :data:`MAX_CANDIDATES` usable ones (the
    exploitation leader and the broadest cross-workload model always kept), then rejected ones.
    """
    active_set = set(active)
    rows: list[Candidate] = []
    for p in fit.profiles:
        suit = p.workload_scores.get(workload, 0.0)
        if suit <= 0.0:
            continue
        compatible, feasible, resident, paths, best, startup, could_fit = fit.row(p.model_id)
        success, oc = outcomes.view(p.model_id, workload, p.artifact_sha256, now)
        qv = quality.get((p.model_id, workload))
        qscore, qc = qv if qv is not None else (0.0, 0.0)
        blended = suit * (1.0 - qc) + qscore * qc
        base = SUITABILITY_POINTS * blended - FAILURE_POINTS * (1.0 - success) * oc
        rejection = None
        if compatible == 0:
            rejection = "no live host is compatible (runtime, backend, GPU, tags or tier)"
        elif not could_fit:
            rejection = "larger than the allocatable memory of every compatible host"
        penalty = 0.0
        if not resident:
            penalty = min(MAX_TRANSITION_POINTS, startup / STARTUP_S_PER_POINT)
            if not feasible:
                penalty += PREEMPTION_POINTS
        bonus = optimism_bonus(oc) if rejection is None else 0.0
        rows.append(
            Candidate(
                workload=workload,
                model_id=p.model_id,
                suitability=suit,
                compatible_hosts=compatible,
                feasible_now=feasible,
                resident=resident,
                preemption_paths=paths,
                best_host=best,
                startup_s=round(startup, 3),
                outcome=round(success, 4),
                outcome_confidence=round(oc, 4),
                quality=qscore if qv is not None else None,
                quality_confidence=qc,
                bonus=round(bonus, 4),
                transition_penalty=round(penalty, 4),
                utility=round(base + bonus - penalty, 4),
                rejection=rejection,
            )
        )
    usable = sorted((c for c in rows if c.usable), key=lambda c: (-c.utility, c.model_id))
    keep = usable[:MAX_CANDIDATES]
    if usable and len(usable) > MAX_CANDIDATES:
        broadest = max(
            usable,
            key=lambda c: (
                sum(1 for w in active_set if fit.by_id[c.model_id].workload_scores.get(w, 0) > 0),
                c.utility,
            ),
        )
        if broadest not in keep:
            keep[-1] = broadest
    rejected = sorted((c for c in rows if not c.usable), key=lambda c: (-c.suitability, c.model_id))
    return (*keep, *rejected)
