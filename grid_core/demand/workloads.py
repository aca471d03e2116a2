"""Unbound (``auto``) workload demand projected onto one configured model.

Until a portfolio planner plugin answers ``grid_search_portfolio``, an unbound request whose
workload the classifier named counts as direct demand for the highest-scoring *feasible*
model for that workload: a model with a positive ``workload_scores`` entry that at least one
currently eligible host could hold (runtime, backend, GPU, tags, pins and memory), ties broken
by the smaller footprint and then the model id. Source: the specification's "Proactive
observation and portfolio planning" (workload scores, compatibility and footprint decide the
projection; the router's fallback never becomes direct demand).

Evidence hygiene: when the request was served by some other model (a router fallback) or by
nothing, its latency, queue and error outcome stay workload evidence and are not copied onto
the projected model; only the arrival counts.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from grid_core.demand.features import RequestFeatures
from grid_core.eligibility import (
    DEFAULT_HEARTBEAT_LIMITS,
    HeartbeatLimits,
    host_ineligible_reason,
    incompatibility,
)
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

UNBOUND = "auto"
"""The model name clients use for unbound work."""


def _feasible(profile: ModelProfile, hosts: list[HostSnapshot], policy: object | None) -> bool:
    pp = policy if isinstance(policy, HeartbeatLimits) else DEFAULT_HEARTBEAT_LIMITS
    for host in hosts:
        if host_ineligible_reason(host, pp) is not None:
            continue
        if incompatibility(profile, host) is not None:
            continue
        if profile.memory_for(host.runtimes) <= host.allocatable_mb - host.external_used_mb:
            return True
    return False


def best_model_for(
    workload: str,
    profiles: Iterable[ModelProfile],
    hosts: Iterable[HostSnapshot],
    policy: object | None = None,
) -> str | None:
    """The highest-scoring feasible model for ``workload``, or ``None`` when none is.

    Args:
        workload: a workload of the configured vocabulary.
        profiles: configured model profiles.
        hosts: current host snapshots.
        policy: planner policy deciding host eligibility (defaults when omitted).
    """
    host_list = list(hosts)
    ranked = sorted(
        (p for p in profiles if p.workload_scores.get(workload, 0.0) > 0.0),
        key=lambda p: (-p.workload_scores[workload], p.memory_mb, p.model_id),
    )
    for p in ranked:
        if _feasible(p, host_list, policy):
            return p.model_id
    return None


def project_unbound(
    features: RequestFeatures,
    profiles: Iterable[ModelProfile],
    hosts: Iterable[HostSnapshot],
    policy: object | None = None,
) -> RequestFeatures:
    """Rewrite an unbound request as direct demand for its workload's best feasible model.

    Named requests, unclassified requests and workloads no feasible model serves come back
    unchanged (idempotent: a projected request is a named request).
    """
    if features.requested_model != UNBOUND or not features.workload:
        return features
    target = best_model_for(features.workload, profiles, hosts, policy)
    if target is None:
        return features
    return _retarget(features, target)


def _retarget(features: RequestFeatures, target: str) -> RequestFeatures:
    if features.served_model == target:
        return msgspec.structs.replace(features, requested_model=target)
    if features.served_model is None:
        # Nothing could serve it: "no ready route" is supply evidence for the projected model.
        return msgspec.structs.replace(
            features,
            requested_model=target,
            service_time_s=None,
            queue_s=0.0,
            outcome="unavailable",
        )
    # Served by a fallback: its latency, queue and outcome belong to the workload, not to
    # the projected model; only the arrival counts.
    return msgspec.structs.replace(
        features, requested_model=target, service_time_s=None, queue_s=0.0, outcome="ok"
    )


def projection_map(
    workloads: Iterable[str],
    profiles: Iterable[ModelProfile],
    hosts: Iterable[HostSnapshot],
    policy: object | None = None,
) -> dict[str, str]:
    """Workload → best feasible model, computed once per planning instant.

    Same rule as :func:`best_model_for`; callers that project many requests between two
    ticks use this map with :func:`project_with` instead of re-scanning the fleet per request.
    """
    profile_list, host_list = list(profiles), list(hosts)
    out: dict[str, str] = {}
    for w in workloads:
        best = best_model_for(w, profile_list, host_list, policy)
        if best is not None:
            out[w] = best
    return out


def project_with(features: RequestFeatures, mapping: dict[str, str]) -> RequestFeatures:
    """:func:`project_unbound` with a precomputed :func:`projection_map`."""
    if features.requested_model != UNBOUND or not features.workload:
        return features
    target = mapping.get(features.workload)
    if target is None:
        return features
    return _retarget(features, target)
