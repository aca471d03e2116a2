"""Host eligibility and static model/host compatibility (hard rules only).

Source: specification, "Safety invariants" 2 (never place on an ineligible host) and "Global
placement loop" (runtime, backend, data tier, tags, pins, GPU rules are hard constraints).

The rules sit below both the planner and the demand side, which needs them to count the hosts
a next replica could start on; ``grid_core.planner.eligibility`` re-exports them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from grid_core.profile import ModelProfile
from grid_core.protection import DRAIN_GRACE_S
from grid_core.snapshot import HostSnapshot

STALE_HEARTBEAT_S = 90.0
"""A heartbeat older than this (three missed 30 s beats) makes a host ineligible for new work."""
FUTURE_SKEW_S = 5.0
"""A heartbeat dated further in the future than this is implausible: the host gets nothing new."""


@runtime_checkable
class HeartbeatLimits(Protocol):
    """The heartbeat-age bounds host eligibility reads (seconds); a PlannerPolicy has them."""

    @property
    def stale_heartbeat_s(self) -> float:
        """Age beyond which a host receives nothing new."""
        ...

    @property
    def future_skew_s(self) -> float:
        """Tolerated future-dated heartbeat (negative age)."""
        ...


class DefaultHeartbeatLimits(msgspec.Struct, frozen=True):
    """The default bounds, for callers that pass no planner policy."""

    stale_heartbeat_s: float = STALE_HEARTBEAT_S
    future_skew_s: float = FUTURE_SKEW_S


DEFAULT_HEARTBEAT_LIMITS = DefaultHeartbeatLimits()

NEW_WORK_STATES = frozenset({"accepting", "throttled"})
"""Lifecycle states that accept new placements; every other state only drains."""
MEMORY_STATES = frozenset({"loading", "warming", "ready", "draining", "failed"})
"""Residency states that hold (or may hold) memory and a model slot."""
SERVING_STATES = frozenset({"loading", "warming", "ready"})
"""Residency states that count as a live or converging replica (an incumbent)."""


def host_ineligible_reason(host: HostSnapshot, policy: HeartbeatLimits) -> str | None:
    """Why ``host`` may receive no new placement, or ``None`` when it is eligible.

    Reasons are machine-stable: ``state:<state>``, ``unhealthy_report``, ``unauthenticated``,
    ``no_heartbeat``, ``stale_heartbeat``, ``future_heartbeat``.
    """
    if host.state not in NEW_WORK_STATES:
        return f"state:{host.state}"
    if not host.healthy:
        return "unhealthy_report"
    if not host.authenticated:
        return "unauthenticated"
    age = host.heartbeat_age_s
    if age is None:
        return "no_heartbeat"
    if age > policy.stale_heartbeat_s:
        return "stale_heartbeat"
    if age < -policy.future_skew_s:
        return "future_heartbeat"
    return None


def incompatibility(profile: ModelProfile, host: HostSnapshot) -> str | None:
    """The first static rule ``host`` breaks for ``profile``, or ``None`` when compatible.

    Static rules do not depend on what else is planned: runtime, backend, data tier, required and
    forbidden tags, GPU count and per-GPU memory. Pins are not a restriction: a pin reserves
    a replica on its host, and demand beyond the pins may use any compatible host. Capacity,
    slots and colocation are checked by the ledger because they change as the plan grows.
    """
    if not any(rt in host.runtimes for rt in profile.runtimes):
        return "runtime"
    if profile.backends and not any(b in host.backends for b in profile.backends):
        return "backend"
    if profile.data_tier is not None and profile.data_tier not in host.data_tiers:
        return "data_tier"
    if profile.required_tags and not all(t in host.tags for t in profile.required_tags):
        return "required_tags"
    if profile.forbidden_tags and any(t in host.tags for t in profile.forbidden_tags):
        return "forbidden_tags"
    if host.gpu_count < profile.min_gpu_count:
        return "gpu_count"
    if profile.min_gpu_memory_mb and host.gpu_memory_mb < profile.min_gpu_memory_mb:
        return "gpu_memory"
    return None


def host_signature(host: HostSnapshot) -> tuple[object, ...]:
    """Everything :func:`incompatibility` reads except the host id (for per-class caching)."""
    return (
        host.runtimes,
        host.backends,
        host.data_tiers,
        host.tags,
        host.gpu_count,
        host.gpu_memory_mb,
    )


def runtime_for(profile: ModelProfile, host: HostSnapshot) -> tuple[str, int]:
    """Runtime a new replica would use on ``host`` and the MB it accounts for.

    The runtime with the smallest declared footprint wins (then the name); the memory charged
    is the conservative :meth:`ModelProfile.memory_for` over the host's runtimes.
    """
    options = [rt for rt in profile.runtimes if rt in host.runtimes]
    chosen = (
        min(options, key=lambda rt: (profile.runtime_memory_mb.get(rt, profile.memory_mb), rt))
        if options
        else profile.runtimes[0]
    )
    return chosen, profile.memory_for(host.runtimes)


def outlasts_protection(
    host: HostSnapshot, profile: ModelProfile, throttled_fraction: float
) -> bool:
    """Whether one typical request of ``profile`` on the throttled ``host`` would outlast the
    grace a protected host gives running work (:data:`~grid_core.protection.DRAIN_GRACE_S`).

    A throttled host yields capacity to its owner and runs every request at the share of
    its capacity it still offers (the smaller of its advertised fraction and the policy's
    ``throttled_fraction``): a request takes its expected service time divided by that share.
    When the host protects its owner further, running requests get the drain grace and no
    more. A request longer than that grace (a minute-long video job at half capacity) cannot
    be counted on there, so planning does not count such a replica as serving its model: the
    model is short, a replica on a host that can finish its jobs is placed (with the
    authority its demand has), and this one keeps serving until that replacement is ready
    (the reconciler's make-before-break). A host that is not throttled, and a short request
    on a throttled one, are unaffected: the host keeps the work it can still finish.

    Source: specification, host protection ("throttled: the host remains useful but yields
    capacity"; drain grace protects requests already running) and "Global placement loop"
    (throttling lowers a candidate; a throttled host exposes only its fraction).
    """
    if host.state != "throttled":
        return False
    frac = max(0.0, min(1.0, host.throttle_fraction, throttled_fraction))
    if frac <= 0.0:
        return True
    return profile.expected_service_time_s / frac > DRAIN_GRACE_S


def placement_incompatibility(
    profile: ModelProfile, host: HostSnapshot, throttled_fraction: float
) -> str | None:
    """Why a *new* replica of ``profile`` cannot go on ``host`` at this planning instant,
    whatever else is planned, or ``None``.

    The static rules of :func:`incompatibility`, plus ``"throttled"``: the host is throttled
    and one typical request would outlast its protection grace
    (:func:`outlasts_protection`). Planning does not count a replica there as serving its
    model, so a new one placed there would be short again at the next tick: the plan would
    load it, discount it and look elsewhere (a flap that also takes the host from work that
    could use it). The rule lifts when the host cools; an existing replica there keeps
    serving until its replacement is ready (make-before-break).
    """
    bad = incompatibility(profile, host)
    if bad is None and outlasts_protection(host, profile, throttled_fraction):
        return "throttled"
    return bad
