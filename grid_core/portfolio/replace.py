"""Replacing stale speculative capacity: the 1.5× mature-beneficiary rule.

Specification, "Proactive observation and portfolio planning": a newly active workload must
not stay invisible behind a full model slot held by an idle speculative model. A *mature*
beneficiary (admitted by ordinary evidence, not a weak media canary) whose workload pressure
is at least :data:`REPLACEMENT_RATIO` times the pressure that justifies the incumbent may use
one exact replacement path per tick. Victims are only idle, managed residents of models with
no direct demand, no pin and no baseline (pinned models, minimum replicas and directly named
demand stay absolute fences). The replacement only withdraws the victim's *workload*
justification: the victim's demand drops by one replica, the planner proves the resulting
plan no longer keeps it on that host, and the reconciler drains before it unloads. Nothing is
treated as free until a later heartbeat proves it.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from grid_core.demand.types import ModelDemand
from grid_core.portfolio.feasibility import SERVING
from grid_core.portfolio.types import Candidate, Replacement, WorkloadDemand
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

REPLACEMENT_RATIO = 1.5
"""Beneficiary pressure over incumbent pressure needed to replace it (specification: "at
least 1.5× the incumbent's … device-time pressure"); the reverse swap then needs the
incumbent to triple, so two workloads never trade a slot back and forth."""
MAX_REPLACEMENTS = 1
"""Exact replacement paths one tick may use (specification: "one exact planner-proved
replacement path")."""
MATURE = frozenset({"observations", "concurrency"})
"""Admissions that count as mature evidence (a weak media canary never replaces anything)."""


def _pressure(
    mapping: Mapping[str, str], workloads: Mapping[str, WorkloadDemand]
) -> dict[str, float]:
    out: dict[str, float] = {}
    for w, m in mapping.items():
        out[m] = out.get(m, 0.0) + workloads[w].offered_concurrency
    return out


def find_replacement(
    mapping: Mapping[str, str],
    workloads: Mapping[str, WorkloadDemand],
    candidates: Mapping[str, tuple[Candidate, ...]],
    hosts: tuple[HostSnapshot, ...],
    protected: frozenset[str],
) -> Replacement | None:
    """The first ranked path (at most sixteen per candidate) the rule allows, or ``None``.

    Args:
        mapping: the decision's workload → model map.
        workloads: admitted workload forecasts.
        candidates: candidate rows (their ranked preemption paths).
        hosts: host snapshots.
        protected: models with direct demand, pins or a baseline (never victims).
    """
    pressure = _pressure(mapping, workloads)
    by_host = {h.host_id: h for h in hosts}
    order = sorted(mapping, key=lambda w: (-workloads[w].offered_concurrency, w))
    for w in order:
        model = mapping[w]
        if workloads[w].admission not in MATURE:
            continue
        cand = next((c for c in candidates.get(w, ()) if c.model_id == model), None)
        if cand is None or cand.resident or cand.feasible_now or not cand.preemption_paths:
            continue
        need = pressure.get(model, 0.0)
        for host_id in cand.preemption_paths:
            host = by_host[host_id]
            victims = tuple(
                sorted(
                    r.model_id
                    for r in host.residencies
                    if r.state in SERVING
                    and r.actuatable
                    and r.active_requests == 0
                    and r.model_id not in protected
                )
            )
            held = sum(pressure.get(v, 0.0) for v in victims)
            if victims and need > 0 and need >= REPLACEMENT_RATIO * held:
                return Replacement(
                    beneficiary=model,
                    workload=w,
                    host_id=host_id,
                    victims=victims,
                    pressure=round(need, 4),
                    victim_pressure=round(held, 4),
                )
    return None


def release(
    demand: Mapping[str, ModelDemand],
    rep: Replacement,
    profiles: Mapping[str, ModelProfile],
    hosts: tuple[HostSnapshot, ...],
) -> dict[str, ModelDemand]:
    """Demand with each victim asking for one replica fewer than it has (never below its
    baseline), its hold released, so the planner can drop the replica on the path host."""
    out = dict(demand)
    for v in rep.victims:
        p = profiles.get(v)
        if p is None:
            continue
        have = sum(
            1 for h in hosts for r in h.residencies if r.model_id == v and r.state in SERVING
        )
        d = out.get(v) or ModelDemand(model_id=v)
        want = max(p.min_replicas, have - 1)
        out[v] = msgspec.structs.replace(
            d, desired_replicas=want, held_replicas=0, reasons=(*d.reasons, "replaced")
        )
    return out
