"""Demand: bounded buckets, request-level p95, EWMA forecast and desired replicas."""

from __future__ import annotations

import math

import pytest

from grid_core.demand import DemandTracker, ForecastPolicy, RequestFeatures
from grid_core.demand.series import LATENCY_BINS, latency_bin, percentile_ms
from grid_core.demand.tracker import REFUSED_EVIDENCE_S
from grid_core.errors import StateError
from grid_core.profile import ModelProfile, validate_profile
from grid_core.routing import MAX_COLD_RETRY_AFTER_S
from grid_core.snapshot import HostSnapshot, ModelPerformance, ResidencySnapshot
from grid_core.testing import plugins_with

NOW = 1_800_000_000.0
EWMA = plugins_with(builtins=("grid_forecast_ewma",))
POLICY = ForecastPolicy(bucket_s=10.0, window_buckets=30)


def prof(model_id: str = "m", **kw: object) -> ModelProfile:
    base: dict[str, object] = {
        "model_id": model_id,
        "memory_mb": 4096,
        "max_replicas": 16,
        "replica_concurrency": 1,
        "target_utilization": 0.5,
    }
    base.update(kw)
    return validate_profile(ModelProfile(**base))  # type: ignore[arg-type]


def host(host_id: str = "h", *residencies: ResidencySnapshot, **kw: object) -> HostSnapshot:
    base: dict[str, object] = {
        "host_id": host_id,
        "capacity_mb": 64 * 1024,
        "runtimes": ("llama.cpp",),
        "heartbeat_age_s": 1.0,
        "residencies": residencies,
    }
    base.update(kw)
    return HostSnapshot(**base)  # type: ignore[arg-type]


def req(at: float, model: str = "m", service: float | None = 1.0, **kw: object) -> RequestFeatures:
    base: dict[str, object] = {
        "at": at,
        "endpoint": "chat",
        "requested_model": model,
        "served_model": model,
        "service_time_s": service,
    }
    base.update(kw)
    return RequestFeatures(**base)  # type: ignore[arg-type]


def steady(
    tracker: DemandTracker, rate_per_bucket: int, buckets: int, end: float = NOW, **kw: object
) -> None:
    for b in range(buckets):
        start = end - (buckets - b) * POLICY.bucket_s
        for i in range(rate_per_bucket):
            tracker.observe(req(start + i * POLICY.bucket_s / max(1, rate_per_bucket), **kw))


def tracker_for(*models: str) -> DemandTracker:
    t = DemandTracker(POLICY)
    t.set_configured(models or ("m",))
    return t


# --- what is counted ---------------------------------------------------------------------


def test_only_configured_named_models_get_a_series():
    t = tracker_for("m")
    assert t.observe(req(NOW, model="m"))
    assert not t.observe(req(NOW, model="random-name"))
    assert not t.observe(req(NOW, model="auto", served_model="m"))
    assert not t.observe(req(NOW, outcome="client_error"))
    assert t.series("random-name") is None and t.series("auto") is None
    t.forecast(NOW, [prof("other")], [], EWMA)
    assert t.series("m") is None  # no longer configured: its history is dropped


def test_bursts_fold_into_their_bucket_and_history_is_bounded():
    t = tracker_for()
    for _ in range(5000):
        t.observe(req(NOW))
    series = t.series("m")
    assert len(series.buckets) == 1 and series.buckets[0].requests == 5000
    for k in range(200):
        t.observe(req(NOW + k * POLICY.bucket_s))
    assert len(t.series("m").buckets) == POLICY.window_buckets


def test_latency_histogram_is_bounded_and_request_level():
    assert latency_bin(1e12) == LATENCY_BINS - 1 and latency_bin(0.0) == 0
    fast = {latency_bin(100.0): 99}
    one_slow = [fast, {latency_bin(60_000.0): 1}]
    p95 = percentile_ms(one_slow)
    assert 100.0 <= p95 <= 125.0  # one outlier among 99 fast requests is tail evidence only
    many_slow = [fast, {latency_bin(60_000.0): 10}]
    assert percentile_ms(many_slow) >= 60_000.0
    assert percentile_ms([{}]) is None


def test_p95_reported_from_observed_requests():
    t = tracker_for()
    for i in range(99):
        t.observe(req(NOW - 5 + i * 0.01, service=0.2))
    t.observe(req(NOW - 1, service=30.0))
    d = t.forecast(NOW, [prof(latency_slo_ms=1000.0)], [host()], EWMA)["m"]
    assert d.p95_ms is not None and d.p95_ms < 300.0
    assert "latency_pressure" not in d.reasons


# --- forecast and desired replicas ---------------------------------------------------------


def test_offered_concurrency_is_rate_times_service_plus_queue():
    t = tracker_for()
    steady(t, 20, 30, service=2.0)  # 2 requests/s, 2 s each
    d = t.forecast(NOW, [prof()], [host()], EWMA)["m"]
    assert d.request_rate_rps == pytest.approx(2.0, rel=0.15)
    assert d.offered_concurrency == pytest.approx(4.0, rel=0.15)
    # 4 busy slots / (1 slot x 0.5 utilisation) x 1.2 headroom -> 10 replicas
    assert d.desired_replicas == math.ceil(d.offered_concurrency * 1.2 / 0.5 - 1e-9)


def test_min_and_max_clamp():
    t = tracker_for()
    steady(t, 100, 30, service=5.0)
    assert t.forecast(NOW, [prof(max_replicas=3)], [host()], EWMA)["m"].desired_replicas == 3
    quiet = tracker_for()
    d = quiet.forecast(NOW, [prof(min_replicas=2)], [host()], EWMA)["m"]
    assert d.desired_replicas == 2 and "baseline" in d.reasons and not d.direct


@pytest.mark.parametrize("pressure", ["queue", "latency", "errors"])
def test_pressure_asks_for_one_replica_beyond_the_ready_set(pressure):
    t = tracker_for()
    kw: dict[str, object] = {}
    if pressure == "latency":
        kw = {"service": 5.0}
    steady(t, 1, 30, **kw)
    if pressure == "errors":
        for i in range(5):
            t.observe(req(NOW - 20 + i, outcome="error", service=None))
    ready = [
        host(
            f"h{i}",
            ResidencySnapshot(
                model_id="m",
                memory_mb=4096,
                state="ready",
                queue_depth=1 if pressure == "queue" and i == 0 else 0,
            ),
        )
        for i in range(3)
    ]
    d = t.forecast(NOW, [prof(latency_slo_ms=1000.0)], ready, EWMA)["m"]
    assert d.ready_replicas == 3
    assert d.desired_replicas == 4
    assert {"queue": "queue_pressure", "latency": "latency_pressure", "errors": "error_pressure"}[
        pressure
    ] in d.reasons


def test_a_failure_asks_for_a_replica_only_while_it_is_live_evidence():
    """One failed named request lifts the window's error rate above the threshold for the
    whole window, but error pressure asks for one replica beyond the ready set on every
    tick; only a live failure (its bucket and the two after it) may ask, so a stale one does
    not keep adding replicas (and evicting other work for them) after the one it asked for."""
    t = tracker_for()
    steady(t, 1, 10)
    t.observe(req(NOW - 5, outcome="error", service=None))
    ready = [host("h0", ResidencySnapshot(model_id="m", memory_mb=4096, state="ready"))]
    d = t.forecast(NOW, [prof()], ready, EWMA)["m"]
    assert "error_pressure" in d.reasons and d.desired_replicas == 2
    later = NOW + 3 * POLICY.bucket_s  # two more buckets completed since the failure
    steady(t, 1, 3, end=later)
    stale = t.forecast(later, [prof()], ready, EWMA)["m"]
    assert stale.error_rate > POLICY.error_pressure  # still in the window's rate...
    assert "error_pressure" not in stale.reasons  # ...but no longer live evidence
    # What it asked for is only held now (kept while it exists, never built by eviction).
    assert stale.desired_replicas - stale.held_replicas == 1
    t.observe(req(later - 1, outcome="error", service=None))
    again = t.forecast(later, [prof()], ready, EWMA)["m"]
    assert "error_pressure" in again.reasons
    assert again.desired_replicas - again.held_replicas == 2


def test_rising_demand_is_projected_across_a_slow_cold_start_with_caps():
    slow = prof(load_estimate_s=240.0, warm_estimate_s=60.0)
    t = tracker_for()
    for b in range(30):  # linear ramp: 0 .. 29 requests per bucket
        for i in range(b):
            t.observe(req(NOW - (30 - b) * 10 + i * 10 / max(1, b), service=1.0))
    d = t.forecast(NOW, [slow], [host()], EWMA)["m"]
    assert d.trend_rps > 0 and "projection" in d.reasons
    assert d.projection_horizon_s == 300.0
    assert d.projected_concurrency <= 2.0 * d.request_rate_rps * d.service_time_s + 1e-9
    # Cached weights and learned warm time shorten the horizon, so less is projected.
    cached = host(cached={"m": None}, performance={"m": ModelPerformance(warm_s=5.0, samples=8)})
    t2 = DemandTracker.__new__(DemandTracker)
    t2.__init__(POLICY)
    t2.from_state(t.to_state())
    d2 = t2.forecast(NOW, [slow], [cached], EWMA)["m"]
    assert d2.projection_horizon_s == 5.0
    assert d2.projected_concurrency < d.projected_concurrency


def test_negative_trend_never_speeds_scale_down():
    t = tracker_for()
    for b in range(30):  # falling ramp
        for i in range(30 - b):
            t.observe(req(NOW - (30 - b) * 10 + i * 10 / (30 - b), service=1.0))
    d = t.forecast(NOW, [prof()], [host()], EWMA)["m"]
    assert d.trend_rps < 0
    level_only = math.ceil(d.request_rate_rps * d.service_time_s * 1.2 / 0.5 - 1e-9)
    assert d.desired_replicas >= level_only
    assert d.projected_concurrency == pytest.approx(d.offered_concurrency)


def test_cooldown_watermark_holds_and_survives_restart_then_expires():
    p = prof(scale_down_cooldown_s=600.0)
    t = tracker_for()
    steady(t, 20, 30, service=2.0)
    busy = t.forecast(NOW, [p], [host()], EWMA)["m"].desired_replicas
    assert busy > 1
    restarted = DemandTracker(POLICY)
    restarted.from_state(t.to_state())
    restarted._series.clear()  # a quiet minute: no history at all
    d = restarted.forecast(NOW + 120, [p], [host()], EWMA)["m"]
    assert d.desired_replicas == busy and "cooldown" in d.reasons
    late = restarted.forecast(NOW + 700, [p], [host()], EWMA)["m"]
    assert late.desired_replicas == 0


def test_recently_ready_replicas_stay_desired():
    used = ResidencySnapshot(model_id="m", memory_mb=4096, state="ready", last_used_at=NOW - 60.0)
    stale = ResidencySnapshot(
        model_id="m", memory_mb=4096, state="ready", last_used_at=NOW - 6000.0
    )
    t = tracker_for()
    d = t.forecast(NOW, [prof()], [host("a", used), host("b", stale)], EWMA)["m"]
    assert d.desired_replicas == 1 and "recent_ready" in d.reasons


def test_ready_replicas_on_ineligible_hosts_do_not_count():
    r = ResidencySnapshot(model_id="m", memory_mb=4096, state="ready")
    t = tracker_for()
    d = t.forecast(NOW, [prof()], [host("a", r, state="paused")], EWMA)["m"]
    assert d.ready_replicas == 0


# --- plugin and persistence -----------------------------------------------------------------


def test_without_a_forecaster_a_plain_average_is_used():
    t = tracker_for()
    steady(t, 20, 30, service=2.0)
    d = t.forecast(NOW, [prof()], [host()], plugins_with())["m"]
    assert d.request_rate_rps == pytest.approx(2.0, rel=0.15) and d.trend_rps == 0.0


def test_state_round_trip_and_bad_state_changes_nothing():
    t = tracker_for()
    steady(t, 3, 5)
    state = t.to_state()
    copy = DemandTracker(POLICY)
    copy.from_state(state)
    assert copy.to_state() == state
    with pytest.raises(StateError, match="version"):
        copy.from_state({**state, "version": 99})
    with pytest.raises(StateError, match="demand state"):
        copy.from_state({"version": 1, "configured": "nope"})
    assert copy.to_state() == state


def test_a_burst_shows_at_once_in_the_filling_bucket():
    t = tracker_for()
    steady(t, 1, 20)
    for i in range(100):
        t.observe(req(NOW + 1 + i * 0.01))
    d = t.forecast(NOW + 2, [prof()], [host()], EWMA)["m"]
    assert d.request_rate_rps >= 10.0


def test_requests_with_no_ready_route_are_demand_for_a_cold_model():
    t = tracker_for()
    for i in range(6):
        t.observe(req(NOW - 30 + i * 5, outcome="unavailable", service=None, served_model=None))
    d = t.forecast(NOW, [prof()], [host()], EWMA)["m"]
    assert d.direct and d.desired_replicas >= 1 and d.ready_replicas == 0


def test_millisecond_routing_waits_are_not_queue_pressure():
    t = tracker_for()
    steady(t, 1, 30, queue_s=0.002)
    ready = [host("a", ResidencySnapshot(model_id="m", memory_mb=4096, state="ready"))]
    d = t.forecast(NOW, [prof()], ready, EWMA)["m"]
    assert "queue_pressure" not in d.reasons and d.desired_replicas == 1


@pytest.mark.parametrize("bad", [float("nan"), -5.0, 86_400.0])
def test_implausible_learned_startup_times_fall_back_to_the_profile(bad):
    perf = ModelPerformance(warm_s=bad, load_s=bad, samples=8)
    t = tracker_for()
    d = t.forecast(
        NOW,
        [prof(load_estimate_s=30.0, warm_estimate_s=10.0)],
        [host(performance={"m": perf})],
        EWMA,
    )["m"]
    assert d.projection_horizon_s == 40.0


# --- surplus after a burst (issue 16) -----------------------------------------------------


def test_a_burst_that_is_no_longer_live_is_held_not_needed():
    """While named requests keep arriving the burst's replicas are needed; once its requests
    leave the live window what the decaying forecast and the scale-down cooldown still keep is
    hysteresis (``held_replicas``): kept while it exists, never rebuilt, reclaimable."""
    p = prof(scale_down_cooldown_s=60.0, min_replicas=1)
    t = tracker_for()
    steady(t, 20, 3, service=2.0)  # a 30 s burst ending now
    live = t.forecast(NOW, [p], [host()], EWMA)["m"]
    assert live.direct and live.desired_replicas > 1 and live.held_replicas == 0
    # The last request fell in the bucket just before NOW: live while two more complete.
    assert live.live_until == NOW + 2 * POLICY.bucket_s
    quiet = t.forecast(NOW + 31.0, [p], [host()], EWMA)["m"]
    assert not quiet.direct and "not_live" in quiet.reasons
    assert quiet.desired_replicas == live.desired_replicas  # still kept while they exist...
    assert quiet.held_replicas == quiet.desired_replicas - 1  # ...as hysteresis only
    assert "held" in quiet.reasons
    later = t.forecast(NOW + 95.0, [p], [host()], EWMA)["m"]  # cooldown over, tail decaying
    assert 1 <= later.desired_replicas < live.desired_replicas
    assert later.held_replicas == later.desired_replicas - 1


def test_a_refused_request_stays_live_while_its_caller_waits_out_retry_after():
    """A cold model's refused request keeps its direct evidence for the longest Retry-After
    Grid advises, so its preemption authority does not lapse while the caller waits; a
    retry refreshes that evidence without counting as a second request."""
    assert REFUSED_EVIDENCE_S >= MAX_COLD_RETRY_AFTER_S
    p = prof()
    t = tracker_for()
    t.observe(req(NOW, service=None, outcome="unavailable"))
    window_end = NOW + 3 * POLICY.bucket_s
    d = t.forecast(window_end + REFUSED_EVIDENCE_S - 1.0, [p], [host()], EWMA)["m"]
    assert d.direct
    late = window_end + REFUSED_EVIDENCE_S + 1.0
    assert not t.forecast(late, [p], [host()], EWMA)["m"].direct
    t.observe(req(late, service=None, outcome="unavailable", retry=True))
    again = t.forecast(late, [p], [host()], EWMA)["m"]
    assert again.direct
    assert sum(b.requests for b in t.series("m").buckets) == 1


# --- engine activity of unbound work (specification, "Proactive observation") -----------


def _busy(active: int, queue: int = 0) -> list[HostSnapshot]:
    r = ResidencySnapshot(
        model_id="m", memory_mb=4096, state="ready", active_requests=active, queue_depth=queue
    )
    return [host("a", r)]


def _unbound(t: DemandTracker, n: int, end: float = NOW) -> None:
    for i in range(n):
        t.observe(req(end - 60 + i * 60 / n, model="auto", workload="image", served_model="m"))


def test_unbound_work_in_flight_never_becomes_direct_demand():
    """An engine busy only with ``auto`` requests the router sent it reports them in flight;
    that is workload demand (the router's choice, already in the workload forecast), so the
    model gets no direct evidence and no preemption authority from it. Work waiting in its
    queue is still the model's own evidence (queue-driven scale-out). The same in-flight work
    on a model callers name stays direct, and so does a model with no finished request yet
    (a first long generation)."""
    routed = tracker_for()
    _unbound(routed, 6)
    d = routed.forecast(NOW, [prof()], _busy(3), EWMA)["m"]
    assert not d.direct and "in_flight" not in d.reasons and d.offered_concurrency == 0.0
    queued = routed.forecast(NOW, [prof()], _busy(3, queue=2), EWMA)["m"]
    assert queued.direct and "queue_pressure" in queued.reasons
    assert "in_flight" not in queued.reasons and queued.offered_concurrency == 2.0

    named = tracker_for()
    steady(named, 1, 6)
    d = named.forecast(NOW, [prof()], _busy(3), EWMA)["m"]
    assert d.direct and "in_flight" in d.reasons and d.offered_concurrency >= 3.0

    fresh = tracker_for()
    d = fresh.forecast(NOW, [prof()], _busy(3), EWMA)["m"]
    assert d.direct and "in_flight" in d.reasons and d.offered_concurrency == 3.0


def test_mixed_traffic_attributes_engine_activity_by_named_share():
    """Half the model's finished requests named it: half its in-flight work is direct."""
    t = tracker_for()
    steady(t, 1, 6, end=NOW - 60)
    _unbound(t, 6)
    d = t.forecast(NOW, [prof()], _busy(8), EWMA)["m"]
    assert d.direct and "in_flight" in d.reasons
    assert d.offered_concurrency == pytest.approx(4.0)
    # Once the unbound requests leave the forecast window the share is whole again.
    later = NOW + POLICY.bucket_s * POLICY.window_buckets
    steady(t, 1, 3, end=later)
    assert t.forecast(later, [prof()], _busy(8), EWMA)["m"].offered_concurrency == 8.0


def test_unbound_service_counts_survive_a_restart():
    t = tracker_for()
    _unbound(t, 4)
    copy = DemandTracker(POLICY)
    copy.from_state(t.to_state())
    assert not copy.forecast(NOW, [prof()], _busy(2), EWMA)["m"].direct


# --- how long a shortfall has lasted (a served model's scale-out) ------------------------


def test_a_shortfall_is_dated_from_its_first_forecast_and_ends_with_it():
    """A served model whose engine queues one request needs one replica beyond the ready set;
    the tracker dates that shortfall from the first forecast that saw it, keeps the date while
    the shortfall lasts, and forgets it once the queue is gone (so a later one starts anew)."""
    t = tracker_for()
    steady(t, 1, 30)
    wide = prof(replica_concurrency=4)  # the arrival rate alone needs one replica

    def fleet(queue: int) -> list[HostSnapshot]:
        r = ResidencySnapshot(model_id="m", memory_mb=4096, state="ready", queue_depth=queue)
        return [host("h0", r)]

    first = t.forecast(NOW, [wide], fleet(1), EWMA)["m"]
    assert first.ready_replicas == 1 and first.desired_replicas == 2
    assert "queue_pressure" in first.reasons and first.short_since == NOW
    t.observe(req(NOW + 5.0))
    still = t.forecast(NOW + 60.0, [wide], fleet(1), EWMA)["m"]
    assert still.short_since == NOW
    t.observe(req(NOW + 65.0))
    served = t.forecast(NOW + 120.0, [wide], fleet(0), EWMA)["m"]
    assert "queue_pressure" not in served.reasons and served.short_since is None
    t.observe(req(NOW + 125.0))
    again = t.forecast(NOW + 180.0, [wide], fleet(1), EWMA)["m"]
    assert again.short_since == NOW + 180.0
