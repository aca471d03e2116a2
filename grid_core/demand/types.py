"""The demand side's per-model answer for one planning instant."""

from __future__ import annotations

import msgspec

STANDBY_REASON = "standby"
"""Reason of demand that only keeps a workload's chosen model on idle capacity before any
request (:mod:`grid_core.portfolio.standby`). It carries no evidence: the planner places it
after every evidence-backed round of its priority class and never lets it preempt, relocate
or take capacity real demand needs (specification, "Proactive observation and portfolio
planning": counterfactual demand may fill spare capacity but never evicts)."""


class ModelDemand(msgspec.Struct, frozen=True, kw_only=True):
    """Near-term demand of one configured model and the replica count it asks for.

    Source: specification, "Global placement loop" (short-horizon demand, target replica count).

    Attributes:
        model_id: configured model id.
        desired_replicas: replicas wanted after headroom, pressure, cooldown and min/max clamping.
        offered_concurrency: requests in service at once = arrival rate × service time + queued
            work (Little's law), before projection.
        request_rate_rps: forecast arrival rate (requests/s).
        queue_depth: queued requests (reported by engines plus measured waiting work).
        p95_ms: approximate request-level p95 end-to-end latency (ms), ``None`` without samples.
        error_rate: engine-side failure fraction (0..1).
        trend_rps: rate change per second (requests/s²); negative never speeds scale-down.
        direct: the model has live direct evidence (named requests seen within the live
            window, or queued work), not only a baseline or the decaying tail of old traffic.
        reasons: machine-stable reasons that set ``desired_replicas`` (``baseline``, ``demand``,
            ``queue_pressure``, ``latency_pressure``, ``error_pressure``, ``cooldown``,
            ``recent_ready``, ``clamped_max``, ``projection``, ``held`` when part of the count
            is hysteresis only, see ``held_replicas``).
        ready_replicas: ready replicas on eligible hosts when forecast.
        service_time_s: service time used (measured, else the profile's expectation).
        projected_concurrency: offered concurrency projected across the startup horizon.
        projection_horizon_s: fastest eligible load+warm time used for the projection (s).
        confidence: forecaster confidence in the trend (0..1).
        held_replicas: replicas of ``desired_replicas`` kept only for hysteresis: by the
            scale-down cooldown (watermark or recently used ready replicas), or by the
            decaying forecast of traffic that is no longer live (no named request within the
            live window), beyond what live demand, pressure and the baseline ask for. The
            planner keeps them while they exist, never places or rebuilds them, and lets
            another model's direct demand reclaim them once idle and past their minimum
            residency (status: ``Plan.surplus``).
        inferred_rps: demand inferred from correlated models (always 0 until correlation
            learning exists; a separate field so inferred demand never counts as direct).
        live_until: Unix seconds at which the model's live evidence (its latest named
            request) leaves the live window if no new request arrives; ``None`` without any.
            From then on what its count still asks beyond the baseline is hysteresis.
        short_since: Unix seconds since which the model has, on every forecast, had live
            direct evidence and needed more replicas than are ready (``desired_replicas``
            minus ``held_replicas`` above ``ready_replicas``); ``None`` when it does not now.
            The planner lets a served model's scale-out take another model's last ready
            replica only once this shortfall has persisted
            (:mod:`grid_core.planner.lastready`).
    """

    model_id: str
    desired_replicas: int = 0
    offered_concurrency: float = 0.0
    request_rate_rps: float = 0.0
    queue_depth: float = 0.0
    p95_ms: float | None = None
    error_rate: float = 0.0
    trend_rps: float = 0.0
    direct: bool = False
    reasons: tuple[str, ...] = ()
    ready_replicas: int = 0
    service_time_s: float = 0.0
    projected_concurrency: float = 0.0
    projection_horizon_s: float = 0.0
    confidence: float = 0.0
    held_replicas: int = 0
    inferred_rps: float = 0.0
    live_until: float | None = None
    short_since: float | None = None

    def harm(self, latency_slo_ms: float | None) -> tuple[float, float, float, float, float]:
        """Attributable service harm, compared lexicographically (larger = more harmed).

        Order from the specification: queue, latency/SLO ratio, errors, offered concurrency,
        request rate. Without an SLO the latency ratio is 0 (no SLO, no SLO harm).
        """
        ratio = 0.0
        if latency_slo_ms and self.p95_ms is not None:
            ratio = self.p95_ms / latency_slo_ms
        return (
            self.queue_depth,
            ratio,
            self.error_rate,
            self.offered_concurrency,
            self.request_rate_rps,
        )

    def live_shortfall(self) -> bool:
        """Whether live direct evidence asks for more replicas than are ready (desired minus
        held above ready): the condition :attr:`short_since` dates."""
        return self.direct and self.desired_replicas - self.held_replicas > self.ready_replicas


class Watermark(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Highest recent desired replica count of a model and when it was last reached.

    Persisted with the demand history, so neither a quiet minute nor a server restart unloads
    a model that was just busy (the scale-down cooldown).

    Attributes:
        desired: the replica count.
        at: wall-clock seconds it was last reached.
    """

    desired: int
    at: float
