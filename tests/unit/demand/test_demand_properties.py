"""Property tests for the demand side: p95 accuracy, bounds, clamps."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core.demand import DemandTracker, ForecastPolicy, RequestFeatures
from grid_core.demand.series import LATENCY_BASE, latency_bin, percentile_ms
from grid_core.profile import ModelProfile, validate_profile
from grid_core.snapshot import HostSnapshot
from grid_core.testing import plugins_with

NOW = 1_800_000_000.0
EWMA = plugins_with(builtins=("grid_forecast_ewma",))
SETTINGS = settings(max_examples=200, deadline=None, derandomize=True)

latencies = st.lists(st.floats(min_value=1.5, max_value=3_600_000.0), min_size=1, max_size=300)


@SETTINGS
@given(latencies, st.integers(1, 5))
def test_histogram_p95_brackets_the_true_request_level_p95(values, buckets):
    hists: list[dict[int, int]] = [{} for _ in range(buckets)]
    for i, ms in enumerate(values):
        h = hists[i % buckets]
        b = latency_bin(ms)
        h[b] = h.get(b, 0) + 1
    ordered = sorted(values)
    true_p95 = ordered[math.ceil(0.95 * len(ordered)) - 1]
    approx = percentile_ms(hists)
    assert approx is not None
    assert true_p95 <= approx * (1 + 1e-9)
    assert approx <= true_p95 * LATENCY_BASE * (1 + 1e-9)


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.floats(0, 600),
            st.floats(0.01, 30.0),
            st.sampled_from(["ok", "ok", "error", "unavailable"]),
            st.floats(0, 5),
        ),
        max_size=200,
    ),
    st.integers(0, 3),
    st.integers(0, 5),
)
def test_desired_is_always_within_bounds_and_state_round_trips(reqs, lo, extra):
    policy = ForecastPolicy(bucket_s=10.0, window_buckets=30)
    t = DemandTracker(policy)
    t.set_configured(["m"])
    for ago, service, outcome, queue in reqs:
        t.observe(
            RequestFeatures(
                at=NOW - ago,
                endpoint="chat",
                requested_model="m",
                service_time_s=service if outcome == "ok" else None,
                outcome=outcome,
                queue_s=queue,
            )
        )
    profile = validate_profile(
        ModelProfile(model_id="m", memory_mb=1024, min_replicas=lo, max_replicas=max(1, lo + extra))
    )
    hosts = [
        HostSnapshot(host_id="h", capacity_mb=8192, runtimes=("llama.cpp",), heartbeat_age_s=1.0)
    ]
    state = t.to_state()
    d = t.forecast(NOW, [profile], hosts, EWMA)["m"]
    assert profile.min_replicas <= d.desired_replicas <= profile.max_replicas
    assert d.offered_concurrency >= 0 and d.projected_concurrency >= d.offered_concurrency - 1e-9
    again = DemandTracker(policy)
    again.from_state(state)
    assert again.forecast(NOW, [profile], hosts, EWMA)["m"] == d
    for series in (t.series("m"),):
        assert series is None or len(series.buckets) <= policy.window_buckets
