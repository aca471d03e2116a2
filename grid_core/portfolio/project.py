"""Projecting a portfolio's workload demand onto models: spare capacity, never eviction.

Specification, "Proactive observation and portfolio planning": counterfactual portfolio
demand is weaker than direct evidence — it may fill spare capacity but cannot evict a
baseline or a directly demanded model. The projection therefore reaches the planner as
*inferred* demand (``direct=False``, ``inferred_rps > 0``), which the planner places only
after baselines and direct demand and never gives preemption or relocation authority. When a
model also has direct demand, the extra replicas the workload asks for are marked
``held_replicas`` (never rebuilt by evicting other work) so direct evidence keeps exactly the
authority it had. The workload's queue is not counted into the model's projected concurrency
(it has not been served by that model yet): it can justify one canary, not several replicas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from grid_core.demand.types import ModelDemand
from grid_core.portfolio.types import WorkloadDemand
from grid_core.profile import ModelProfile

EPSILON = 1e-9
"""Guards ceil() against float noise."""


def project(
    direct: Mapping[str, ModelDemand],
    workloads: Mapping[str, WorkloadDemand],
    mapping: Mapping[str, str],
    profiles: Mapping[str, ModelProfile],
    headroom: float,
    capped: frozenset[str] = frozenset(),
) -> dict[str, ModelDemand]:
    """Every model's demand with the portfolio's workload demand added.

    Args:
        direct: named-model demand by model id (returned unchanged for unmapped models).
        workloads: admitted workload forecasts.
        mapping: workload → model id.
        profiles: configured profiles by id.
        headroom: demand headroom fraction (the forecast policy's).
        capped: workloads whose demand may ask for one replica only (weak or unvalidated
            evidence).

    Returns:
        model id → :class:`ModelDemand`.
    """
    out = dict(direct)
    by_model: dict[str, list[WorkloadDemand]] = {}
    for w, m in sorted(mapping.items()):
        if m in profiles and w in workloads:
            by_model.setdefault(m, []).append(workloads[w])
    for m, ws in by_model.items():
        p = profiles[m]
        d = direct.get(m) or ModelDemand(model_id=m, service_time_s=p.expected_service_time_s)
        service = d.service_time_s or p.expected_service_time_s
        rate = sum(x.request_rate_rps for x in ws)
        offered = rate * service
        per_replica = p.replica_concurrency * p.target_utilization
        want = max(1, math.ceil(offered * (1.0 + headroom) / per_replica - EPSILON))
        if all(x.workload in capped for x in ws):
            want = 1
        own = d.desired_replicas - d.held_replicas if d.direct else 0
        if d.direct:
            direct_need = math.ceil(d.projected_concurrency * (1.0 + headroom) / per_replica)
            want = max(want, 0) + max(0, direct_need)
        desired = min(p.max_replicas, max(d.desired_replicas, want))
        extra = max(0, desired - max(own, p.min_replicas))
        held = d.held_replicas
        if not d.direct and d.ready_replicas == 0:
            # The workload's model serves nowhere: its first replica is placeable, whatever
            # scale-down hold older named demand left.
            held = min(held, desired - 1)
        out[m] = msgspec.structs.replace(
            d,
            desired_replicas=desired,
            inferred_rps=d.inferred_rps + rate,
            held_replicas=extra if d.direct else held,
            reasons=(*d.reasons, "workload"),
            projected_concurrency=d.projected_concurrency + offered,
        )
    return out
