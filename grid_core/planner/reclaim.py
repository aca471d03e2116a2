"""When a cold model can expect a host: the estimate behind an honest ``Retry-After``.

Source: issue 16 (a burst's surplus replicas must yield promptly to direct demand for a cold
model) and the specification's "Global placement loop" (minimum residency is never bypassed;
direct evidence is what gives destructive authority). The planner reclaims an idle surplus
replica once its model's live evidence has expired and its minimum residency has passed
(:func:`grid_core.planner.phases.surplus_hold`); this module predicts *when* that will first
be true on a host the cold model fits, so a client is told to come back then instead of
giving up on a short default. It decides nothing: the next plan does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grid_core.demand.types import ModelDemand
from grid_core.eligibility import (
    DEFAULT_HEARTBEAT_LIMITS,
    MEMORY_STATES,
    SERVING_STATES,
    host_ineligible_reason,
    incompatibility,
)
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot


def surplus_release_s(
    model: ModelProfile,
    profiles: Mapping[str, ModelProfile],
    demand: Mapping[str, ModelDemand],
    hosts: Sequence[HostSnapshot],
    now: float,
) -> float | None:
    """Seconds until some host ``model`` fits on holds only work that may be taken for it.

    A host qualifies when ``model`` is compatible with it, fits its allocatable memory once
    emptied, and every live residency on it is managed, not pinned there, and either of lower
    priority than ``model`` or a replica its model could spare (more replicas than its
    baseline, its pins and one). Such a residency is free to go once its minimum residency has
    passed and, for a spare replica of a model with live evidence, once that evidence leaves
    the live window (``ModelDemand.live_until``) — assuming no new request for it arrives.

    Args:
        model: the cold model's profile.
        profiles: every configured profile by model id.
        demand: the latest forecast per model id.
        hosts: current host snapshots.
        now: Unix seconds.

    Returns:
        The smallest wait over the qualifying hosts (0 when one qualifies now), or ``None``
        when no host can qualify without an operator change (pins, baselines, external work).
    """
    serving: dict[str, int] = {}
    for host in hosts:
        for r in host.residencies:
            if r.state in SERVING_STATES:
                serving[r.model_id] = serving.get(r.model_id, 0) + 1
    best: float | None = None
    for host in hosts:
        if host_ineligible_reason(host, DEFAULT_HEARTBEAT_LIMITS) is not None:
            continue
        if incompatibility(model, host) is not None or model.memory_mb > host.allocatable_mb:
            continue
        if host.residency(model.model_id) is not None:
            continue
        wait = 0.0
        for r in host.residencies:
            if r.state not in MEMORY_STATES:
                continue
            free_in = _free_in(model, r, host.host_id, profiles, demand, serving, now)
            if free_in is None:
                break
            wait = max(wait, free_in)
        else:
            best = wait if best is None else min(best, wait)
    return best


def _free_in(
    model: ModelProfile,
    r: ResidencySnapshot,
    host_id: str,
    profiles: Mapping[str, ModelProfile],
    demand: Mapping[str, ModelDemand],
    serving: Mapping[str, int],
    now: float,
) -> float | None:
    """Seconds until residency ``r`` may be taken for ``model``, or ``None`` if never."""
    if not r.actuatable:
        return None
    q = profiles.get(r.model_id)
    if q is None or r.state in ("draining", "failed"):
        return 0.0  # obsolete, draining or failed work is already on its way out
    if host_id in q.pins:
        return None
    fence = 0.0
    if r.loaded_at is not None and r.state in ("loading", "warming", "ready"):
        fence = max(0.0, r.loaded_at + q.min_residency_s - now)
    if q.priority < model.priority:
        return fence
    have = serving.get(q.model_id, 0)
    floor = max(1, q.min_replicas, len(q.pins))
    if have <= floor:
        return None  # its last replica, its baseline or its pins: never surplus
    d = demand.get(q.model_id)
    if d is None or have > max(floor, d.desired_replicas - d.held_replicas):
        return fence  # surplus already: held only for hysteresis
    if d.direct and d.live_until is not None:
        return max(fence, d.live_until - now)  # surplus once its burst leaves the live window
    return fence
