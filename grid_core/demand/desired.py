"""From a forecast to a desired replica count for one model.

Source: specification, "Global placement loop": offered concurrency (Little's law plus queued
work), demand headroom, queue/latency/error pressure (+1 beyond the ready set), min/max clamp,
rising-demand projection across the fastest eligible load+warm path (confidence-weighted,
capped at 5 minutes / 2x), negative trends never speeding scale-down, and the scale-down
cooldown (recent ready replicas plus a persisted demand watermark).

Replicas the count keeps only for hysteresis (the cooldown, or the decaying tail of traffic
that is no longer live) are reported as ``held_replicas``: the planner keeps them while they
exist, never rebuilds them, and lets direct demand of another model reclaim them once they are
idle and past their minimum residency (issue 16: a burst's surplus must not starve a cold
model for the whole demand window).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from grid_core.demand.series import Forecast, ForecastPolicy
from grid_core.demand.types import ModelDemand, Watermark
from grid_core.eligibility import (
    DEFAULT_HEARTBEAT_LIMITS,
    HeartbeatLimits,
    host_ineligible_reason,
    incompatibility,
    outlasts_protection,
)
from grid_core.profile import ModelProfile, revision_matches
from grid_core.snapshot import HostSnapshot, ModelPerformance

EPSILON = 1e-9
"""Guards ceil() against float noise (3.0000000001 replicas is 3, not 4)."""
QUEUE_PRESSURE = 0.5
"""Queued requests (engine-reported plus mean measured waiting) that count as queue pressure:
half a request waiting on average is real backlog, millisecond routing waits are not."""
LIVE_EVIDENCE_BUCKETS = 2
"""Completed buckets (besides the filling one) in which a named request still counts as live
direct evidence. The EWMA keeps a positive rate for the whole window after traffic stops; only
requests this recent (two buckets: one full bucket of silence is not yet a trend) may justify
evicting other work."""
MAX_LEARNED_S = 3600.0
"""Learned durations above an hour are implausible reports and are ignored."""
NAMED_IN_FLIGHT = 0.5
"""Requests in flight attributable to named traffic that make a model's demand direct: half a
request on average, the same bar as :data:`QUEUE_PRESSURE` (a share of one running request
that is mostly unbound work is not named evidence)."""


def named_share(named: float, unbound: float) -> float:
    """The part (0..1) of a model's in-flight requests attributable to callers that named it.

    Args:
        named: requests naming the model that finished within the forecast window.
        unbound: unbound (``auto``) requests the model served within the same window.

    Engines report in-flight requests without saying who asked. Unbound requests running on
    a model are the router's choice serving a workload whose device time the workload
    forecast already counts (rate x measured service time), and the router's choice never
    becomes direct demand (specification, "Proactive observation and portfolio planning").
    Work *waiting* in the engine queue stays whole model evidence: queue-driven scale-out
    comes from the model's own observations once real traffic reaches it (same section).
    Without any completion in the window the activity is taken as named (a first long
    generation).
    """
    total = named + unbound
    return named / total if total > 0 else 1.0


def learned_s(value: float | None, prior: float) -> float:
    """A learned duration when it is plausible (finite, 0..1 hour), else the profile prior."""
    if value is None or not math.isfinite(value) or not 0.0 <= value <= MAX_LEARNED_S:
        return prior
    return value


def startup_path_s(profile: ModelProfile, perf: ModelPerformance | None, cached: bool) -> float:
    """Seconds from nothing to a ready replica on one host (load phase + warm phase).

    The learned values in ``perf`` are already blended with the profile's priors by the
    controller (authoritative after enough samples, keyed to the artifact revision). Cached
    exact weights skip the load phase; otherwise a profile with an autonomous artifact source
    pays the learned *fetch* time (a verify-only load time would pretend the network transfer
    is instant), and one without pays the learned verify-only load time. Anything missing or
    implausible falls back to the profile's prior.
    """
    warm = learned_s(perf.warm_s if perf is not None else None, profile.warm_estimate_s)
    if cached:
        return warm
    if perf is None:
        return warm + profile.load_estimate_s
    phase = perf.fetch_s if profile.artifact_source is not None else perf.load_s
    return warm + learned_s(phase, profile.load_estimate_s)


def eligible_hosts(hosts: list[HostSnapshot], planner_policy: object | None) -> list[bool]:
    """Per host, whether it may receive new work (the planner's own eligibility rule)."""
    limits = (
        planner_policy if isinstance(planner_policy, HeartbeatLimits) else DEFAULT_HEARTBEAT_LIMITS
    )
    return [host_ineligible_reason(h, limits) is None for h in hosts]


def startup_horizon_s(
    profile: ModelProfile, hosts: list[HostSnapshot], eligible: list[bool]
) -> float:
    """Fastest eligible next replica's load+warm time (seconds).

    Cached exact weights skip the load phase; learned per-host times (see
    :func:`startup_path_s`) replace the profile's priors. Hosts already running the model do
    not count (they are not a *next* replica). Without any candidate the profile's priors are used.
    """
    best: float | None = None
    for host, ok in zip(hosts, eligible, strict=True):
        if not ok or incompatibility(profile, host) is not None:
            continue
        res = host.residency(profile.model_id)
        if res is not None and res.state in ("loading", "warming", "ready"):
            continue
        cached = profile.model_id in host.cached and revision_matches(
            profile, host.cached[profile.model_id]
        )
        total = startup_path_s(profile, host.performance.get(profile.model_id), cached)
        best = total if best is None else min(best, total)
    return best if best is not None else profile.load_estimate_s + profile.warm_estimate_s


def _live_replicas(
    profile: ModelProfile,
    hosts: list[HostSnapshot],
    eligible: list[bool],
    now: float,
    throttled_fraction: float = 1.0,
) -> tuple[int, int, int, int]:
    """(ready replicas on eligible hosts, those used within the cooldown, engine queue,
    requests in flight on the model's serving and draining replicas).

    A replica on a throttled host where one of the model's requests outlasts the protection
    drain grace is neither ready supply nor a cooldown hold
    (:func:`~grid_core.eligibility.outlasts_protection`): the planner does not count it, so
    the demand must not keep its count as hysteresis either.
    """
    ready = recent = queue = in_flight = 0
    mid = profile.model_id
    for host, usable in zip(hosts, eligible, strict=True):
        ok = usable and not outlasts_protection(host, profile, throttled_fraction)
        for res in host.residencies:
            if res.model_id != mid:
                continue
            queue += res.queue_depth
            if res.state in ("ready", "draining") and res.active_requests:
                in_flight += res.active_requests
            # A replica of another artifact revision is being replaced: it neither counts as
            # ready capacity nor holds a cooldown slot for itself.
            if res.state == "ready" and ok and revision_matches(profile, res.artifact_sha256):
                ready += 1
                last = res.last_used_at if res.last_used_at is not None else res.loaded_at
                if last is not None and now - last < profile.scale_down_cooldown_s:
                    recent += 1
    return ready, recent, queue, in_flight


def errors_live(errors_until: float | None, now: float, policy: ForecastPolicy) -> bool:
    """Whether the window's latest failed request is still live evidence at ``now``.

    ``errors_until`` is when the bucket holding it ended (Unix seconds, ``None`` without
    errors). Like arrivals (:data:`LIVE_EVIDENCE_BUCKETS`), a failure stays live for two
    completed buckets: the window's error *rate* keeps one old failure above the threshold
    for the whole window, and error pressure asks for one replica beyond the ready set on
    every tick, so a stale failure would keep adding replicas (and evicting other work for
    them) long after the replica it asked for arrived.
    """
    return errors_until is not None and now < errors_until + LIVE_EVIDENCE_BUCKETS * policy.bucket_s


def _pressures(
    profile: ModelProfile,
    fc: Forecast,
    queue: float,
    policy: ForecastPolicy,
    failing: bool = True,
) -> list[str]:
    """Pressure reasons that each ask for one replica beyond the ready set (error pressure
    only while ``failing``: a failure is live evidence, :func:`errors_live`)."""
    out = []
    if queue >= QUEUE_PRESSURE:
        out.append("queue_pressure")
    if (
        profile.latency_slo_ms is not None
        and fc.p95_ms is not None
        and fc.p95_ms > profile.latency_slo_ms
    ):
        out.append("latency_pressure")
    if failing and fc.rate_rps > 0 and fc.error_rate > policy.error_pressure:
        out.append("error_pressure")
    return out


def _cooldown(
    profile: ModelProfile,
    want: int,
    recent_ready: int,
    watermark: Watermark | None,
    now: float,
    reasons: list[str],
) -> tuple[int, Watermark | None]:
    """Hold the count during the scale-down cooldown; returns (count, new watermark).

    The watermark (highest recent count and when it was reached) is persisted, so neither a
    quiet minute nor a server restart unloads a model that was just busy.
    """
    mark = watermark
    if mark is not None and now - mark.at >= profile.scale_down_cooldown_s:
        mark = None
    if want > 0 and (mark is None or want >= mark.desired):
        mark = Watermark(desired=want, at=now)
    if mark is not None and mark.desired > want:
        want = mark.desired
        reasons.append("cooldown")
    if recent_ready > want:
        want = recent_ready
        reasons.append("recent_ready")
    return want, mark


def desired_for(
    profile: ModelProfile,
    fc: Forecast,
    hosts: list[HostSnapshot],
    now: float,
    policy: ForecastPolicy,
    watermark: Watermark | None,
    planner_policy: object | None = None,
    eligible: list[bool] | None = None,
    live: bool = True,
    share: float = 1.0,
    failing: bool = True,
) -> tuple[ModelDemand, Watermark | None]:
    """Demand and desired replicas of one model, plus its new scale-down watermark.

    Args:
        profile: the model's profile (replica concurrency, target utilisation, bounds).
        fc: the forecast (rates in requests/s, times in seconds).
        hosts: host snapshots sorted by id (ready replicas, engine queues, startup paths).
        now: planning instant (Unix seconds).
        policy: demand tunables.
        watermark: the model's persisted :class:`~grid_core.demand.types.Watermark` or None.
        planner_policy: planner policy deciding host eligibility (defaults when None).
        eligible: precomputed :func:`eligible_hosts` (one per host) to skip recomputing it.
        live: whether a named request arrived within the live window (see
            :data:`LIVE_EVIDENCE_BUCKETS`); without it only the engines' current queue is
            direct evidence, the decaying forecast is not.
        share: the part of the engines' in-flight requests attributable to named traffic
            (:func:`named_share`); the rest is unbound work, which is workload demand.
        failing: whether a failed request is still live evidence (:func:`errors_live`);
            without it the window's error rate is no error pressure.

    Returns:
        ``(ModelDemand, watermark)``; watermark ``None`` when nothing needs remembering.
    """
    if eligible is None:
        eligible = eligible_hosts(hosts, planner_policy)
    ready, recent_ready, engine_queue, running = _live_replicas(
        profile, hosts, eligible, now, getattr(planner_policy, "throttled_fraction", 1.0)
    )
    in_flight = running * min(1.0, max(0.0, share))
    reasons: list[str] = []
    load = _load(profile, fc, hosts, eligible, policy, engine_queue, in_flight, live, reasons)
    want = _wanted(profile, fc, policy, load.projected, load.queue, ready, reasons, failing)
    asked = max(profile.min_replicas, min(want, profile.max_replicas))
    if not load.direct and want:
        # Without live evidence the decaying tail of old traffic (the window's EWMA level and
        # its window-averaged queue) is not a current need: what it still asks for beyond the
        # baseline is kept like the scale-down cooldown keeps replicas, as hysteresis.
        asked = profile.min_replicas
        reasons.append("not_live")
    want, new_mark = _cooldown(profile, want, recent_ready, watermark, now, reasons)
    want = _within_bounds(profile, want, reasons)
    held = max(0, want - asked)
    if held:
        reasons.append("held")
    demand = ModelDemand(
        model_id=profile.model_id,
        desired_replicas=want,
        offered_concurrency=load.offered,
        request_rate_rps=fc.rate_rps,
        queue_depth=load.queue,
        p95_ms=fc.p95_ms,
        error_rate=fc.error_rate,
        trend_rps=fc.trend_rps,
        direct=load.direct,
        reasons=tuple(dict.fromkeys(reasons)),
        ready_replicas=ready,
        service_time_s=load.service,
        projected_concurrency=load.projected,
        projection_horizon_s=load.horizon,
        confidence=fc.confidence,
        held_replicas=held,
    )
    return demand, new_mark


class _Load(NamedTuple):
    """What one model carries now and across its startup horizon."""

    service: float
    """Seconds per request (measured, else the profile's prior)."""
    queue: float
    """Waiting requests: the engines' queues plus the forecast's measured waiting."""
    offered: float
    """Concurrency now: Little's law (or the requests running, if more) plus the queue."""
    projected: float
    """The same at the end of the startup horizon, from the projected rate."""
    horizon: float
    """Seconds of the fastest eligible load+warm path, capped by the policy."""
    direct: bool
    """Whether the demand rests on direct evidence (engine queue, named work, live arrivals)."""


def _load(
    profile: ModelProfile,
    fc: Forecast,
    hosts: list[HostSnapshot],
    eligible: list[bool],
    policy: ForecastPolicy,
    engine_queue: float,
    in_flight: float,
    live: bool,
    reasons: list[str],
) -> _Load:
    """The model's offered and projected concurrency (requests) and whether its evidence is
    direct; ``projection`` and ``in_flight`` are noted in ``reasons`` when they decide."""
    service = fc.service_time_s if fc.service_time_s else profile.expected_service_time_s
    queue = engine_queue + fc.queued
    # Requests running now are demand even before any of them completes (long generations
    # finish minutes later; the forecast only learns from finished requests).
    offered = max(fc.rate_rps * service, in_flight) + queue
    horizon = min(startup_horizon_s(profile, hosts, eligible), policy.projection_cap_s)
    projected = max(_projected_rate(fc, horizon, policy) * service, in_flight) + queue
    if projected > offered + EPSILON:
        reasons.append("projection")
    # Direct evidence: the engines' own queue, named work running now, or live arrivals.
    direct = (
        engine_queue >= QUEUE_PRESSURE
        or in_flight >= NAMED_IN_FLIGHT
        or (live and (fc.rate_rps > 0 or queue >= QUEUE_PRESSURE))
    )
    if in_flight >= NAMED_IN_FLIGHT:
        reasons.append("in_flight")
    return _Load(service, queue, offered, projected, horizon, direct)


def _within_bounds(profile: ModelProfile, want: int, reasons: list[str]) -> int:
    """``want`` clamped to ``[min_replicas, max_replicas]``, noting ``baseline`` or
    ``clamped_max`` in ``reasons`` when a bound decided."""
    if want < profile.min_replicas:
        reasons.append("baseline")
        return profile.min_replicas
    if want > profile.max_replicas:
        reasons.append("clamped_max")
        return profile.max_replicas
    return want


def _projected_rate(fc: Forecast, horizon_s: float, policy: ForecastPolicy) -> float:
    """The arrival rate (requests/s) expected once a replica started now is ready.

    A rising trend is extrapolated over ``horizon_s`` (the startup horizon), weighted by the
    forecast's confidence and capped at ``policy.projection_cap_ratio`` times today's rate; a
    falling trend never speeds scale-down, so it leaves the rate as it is.
    """
    rising = max(0.0, fc.trend_rps)
    if rising <= 0 or fc.rate_rps <= 0:
        return fc.rate_rps
    return min(
        fc.rate_rps + rising * horizon_s * max(0.0, min(1.0, fc.confidence)),
        fc.rate_rps * policy.projection_cap_ratio,
    )


def _wanted(
    profile: ModelProfile,
    fc: Forecast,
    policy: ForecastPolicy,
    projected: float,
    queue: float,
    ready: int,
    reasons: list[str],
    failing: bool = True,
) -> int:
    """Replicas the projected concurrency and the queue/latency pressures ask for (before the
    profile's bounds and the cooldown); appends ``demand`` and each pressure to ``reasons``."""
    per_replica = profile.replica_concurrency * profile.target_utilization
    want = 0
    if projected > EPSILON:
        want = max(1, math.ceil(projected * (1.0 + policy.headroom) / per_replica - EPSILON))
        reasons.append("demand")
    for pressure in _pressures(profile, fc, queue, policy, failing):
        want = max(want, ready + 1)
        reasons.append(pressure)
    return want
