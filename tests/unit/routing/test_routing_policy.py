"""Routing policy: load fraction, hard gates, breaker, rendezvous affinity, measurements."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core import routing
from grid_core.routing import (
    CLOSED,
    Measurement,
    RouteCandidate,
    admission_limit,
    choose_route,
    record_outcome,
    record_sample,
)

NOW = 1_800_000_000.0


def cand(eid: str, **kw: object) -> RouteCandidate:
    return RouteCandidate(engine_id=eid, host_id=f"h-{eid}", **kw)  # type: ignore[arg-type]


# --- load fraction ------------------------------------------------------------------------
def test_wide_engine_with_more_raw_requests_beats_a_narrow_busy_one() -> None:
    wide = cand("vllm", active_requests=8, max_concurrency=32)  # 25% busy
    narrow = cand("llama", active_requests=1, max_concurrency=2)  # 50% busy
    assert choose_route([narrow, wide], NOW) == "vllm"


def test_advertised_queue_counts_against_an_engine() -> None:
    backlog = cand("a", active_requests=0, max_concurrency=8, queue_depth=16)
    clear = cand("b", active_requests=2, max_concurrency=8)
    assert choose_route([backlog, clear], NOW) == "b"


def test_missing_capacity_is_raw_load_and_zero_capacity_is_closed() -> None:
    unknown = cand("unknown", active_requests=1)  # counts as 1 of 1 slot
    known = cand("known", active_requests=1, max_concurrency=4)
    assert choose_route([unknown, known], NOW) == "known"
    closed = cand("closed", max_concurrency=0)
    assert choose_route([closed], NOW) is None


def test_accepting_host_beats_a_less_loaded_throttled_host() -> None:
    accepting = cand("acc", active_requests=3, max_concurrency=4)
    throttled = cand("thr", host_state="throttled", max_concurrency=4)
    assert choose_route([throttled, accepting], NOW) == "acc"


def test_saturated_engine_yields_to_one_with_a_free_slot() -> None:
    full = cand("full", active_requests=2, max_concurrency=2)
    fast = Measurement(latency_ms=10.0, latency_samples=8, latency_at=NOW)
    slow = Measurement(latency_ms=1000.0, latency_samples=8, latency_at=NOW)
    free = cand("free", active_requests=3, max_concurrency=4, measurement=slow)
    assert choose_route([msgspec.structs.replace(full, measurement=fast), free], NOW) == "free"


def test_concurrency_is_a_hard_admission_boundary() -> None:
    """Every ready engine saturated: no route (wait or 503), never a pile-on."""
    full = cand("full", active_requests=2, max_concurrency=2)
    fuller = cand("fuller", active_requests=9, max_concurrency=4)
    assert choose_route([full, fuller], NOW) is None
    assert choose_route([full, cand("free", active_requests=1, max_concurrency=2)], NOW) == "free"


def test_throttled_host_admits_only_its_fraction_of_concurrency() -> None:
    throttled = cand("thr", host_state="throttled", max_concurrency=8, concurrency_multiplier=0.25)
    assert admission_limit(throttled) == 2
    assert choose_route([msgspec.structs.replace(throttled, active_requests=1)], NOW) == "thr"
    assert choose_route([msgspec.structs.replace(throttled, active_requests=2)], NOW) is None
    # The multiplier only applies while the host is throttled; a fraction of 0 admits nothing.
    assert admission_limit(msgspec.structs.replace(throttled, host_state="accepting")) == 8
    assert admission_limit(msgspec.structs.replace(throttled, concurrency_multiplier=0.0)) == 0
    tiny = cand("one", host_state="throttled", max_concurrency=1, concurrency_multiplier=0.5)
    assert admission_limit(tiny) == 1


@pytest.mark.parametrize("state", ["draining", "paused", "unhealthy", "quarantined"])
def test_closed_host_states_never_route(state: str) -> None:
    assert choose_route([cand("x", host_state=state)], NOW) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("state", ["loading", "cached", "warming", "draining", "failed"])
def test_non_ready_residency_never_routes(state: str) -> None:
    busy_ready = cand("ready", active_requests=49, max_concurrency=50)
    idle = cand("idle", residency_state=state)  # type: ignore[arg-type]
    assert choose_route([idle], NOW) is None
    assert choose_route([idle, busy_ready], NOW) == "ready"


def test_expired_lease_and_open_breaker_never_route() -> None:
    assert choose_route([cand("a", admitted=False)], NOW) is None
    assert choose_route([cand("a", breaker_open=True)], NOW) is None


def test_future_dated_lease_gains_no_priority() -> None:
    future = cand("a-future", lease_age_s=-30.0)
    fresh = cand("b-fresh", lease_age_s=0.0)
    older = cand("c-older", lease_age_s=20.0)
    # Clamped to zero age, the future lease ties with the fresh one (id breaks the tie);
    # both beat the older lease.
    assert choose_route([older, fresh, future], NOW) == "a-future"
    assert choose_route([older, fresh], NOW) == "b-fresh"


# --- circuit breaker ----------------------------------------------------------------------
def test_one_429_opens_for_one_second() -> None:
    b = record_outcome(CLOSED, "rate_limited", 100.0)
    assert b.is_open(100.5)
    assert not b.is_open(101.0 + 1e-6)


def test_two_consecutive_5xx_open_and_one_does_not() -> None:
    one = record_outcome(CLOSED, "failure", 100.0)
    assert not one.is_open(100.0)
    two = record_outcome(one, "failure", 100.0)
    assert two.is_open(100.0)


def test_caller_4xx_never_counts() -> None:
    b = CLOSED
    for _ in range(10):
        b = record_outcome(b, "client_error", 100.0)
    assert not b.is_open(100.0)
    one = record_outcome(CLOSED, "failure", 100.0)
    # A 400 between two failures does not reset the streak and does not open on its own.
    mixed = record_outcome(record_outcome(one, "client_error", 100.0), "failure", 100.0)
    assert mixed.is_open(100.0)


def test_backoff_doubles_and_caps_at_thirty_seconds() -> None:
    b = CLOSED
    periods = []
    t = 0.0
    for _ in range(12):
        b = record_outcome(b, "failure", t)
        periods.append(round(b.open_until - t, 6) if b.open_until > t else 0.0)
    assert periods[:6] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0]
    assert max(periods) == routing.BREAKER_MAX_S


def test_a_late_429_never_shortens_a_longer_backoff() -> None:
    b = CLOSED
    for _ in range(5):
        b = record_outcome(b, "failure", 0.0)  # open for 8 s
    late = record_outcome(b, "rate_limited", 0.5)
    assert late.is_open(7.9)


def test_half_open_admits_one_probe_and_success_resets() -> None:
    b = record_outcome(record_outcome(CLOSED, "failure", 0.0), "failure", 0.0)  # open 1 s
    assert b.is_open(0.5)
    assert b.half_open(1.5) and not b.is_open(1.5)
    probing = routing.begin_request(b, 1.5)
    assert probing.is_open(1.6)  # only one probe at a time
    assert record_outcome(probing, "success", 2.0) == CLOSED
    reopened = record_outcome(probing, "failure", 2.0)
    assert reopened.is_open(2.5) and reopened.open_until - 2.0 == 2.0


# --- affinity -----------------------------------------------------------------------------
ENGINES = [f"eng-{i}" for i in range(5)]


def test_affinity_key_is_validated_and_hashed() -> None:
    assert routing.hash_affinity_key("session-1") != "session-1"
    assert routing.hash_affinity_key("session-1") == routing.hash_affinity_key("session-1")
    assert routing.hash_affinity_key("") is None
    assert routing.hash_affinity_key("bad\nkey") is None
    assert routing.hash_affinity_key("é" * 128) is not None  # 256 bytes
    assert routing.hash_affinity_key("é" * 129) is None  # 258 bytes


def test_removing_one_of_five_engines_remaps_only_its_sessions() -> None:
    keys = [routing.hash_affinity_key(f"session-{i}") for i in range(2000)]
    before = {k: choose_route([cand(e) for e in ENGINES], NOW, affinity_hash=k) for k in keys}
    removed = "eng-2"
    after = {
        k: choose_route([cand(e) for e in ENGINES if e != removed], NOW, affinity_hash=k)
        for k in keys
    }
    moved = [k for k in keys if before[k] != after[k]]
    assert moved, "some sessions must have lived on the removed engine"
    assert all(before[k] == removed for k in moved)
    # Every engine got a fair share, so this is not hash-mod-N with a lucky constant.
    counts = {e: sum(1 for v in before.values() if v == e) for e in ENGINES}
    assert min(counts.values()) > 2000 / 5 * 0.7


@settings(max_examples=200, deadline=None)
@given(
    key=st.text(min_size=1, max_size=40).filter(str.isprintable), removed=st.sampled_from(ENGINES)
)
def test_rendezvous_is_stable_under_removal(key: str, removed: str) -> None:
    h = routing.hash_affinity_key(key)
    assert h is not None
    before = routing.rendezvous_pick(h, ENGINES)
    after = routing.rendezvous_pick(h, [e for e in ENGINES if e != removed])
    assert before in (after, removed)


def test_affinity_only_considers_routes_within_twenty_percent() -> None:
    idle = [cand(e, max_concurrency=4) for e in ENGINES]
    busy = msgspec.structs.replace(idle[0], active_requests=4)  # waves 2.0 vs 1.0
    keys = [routing.hash_affinity_key(f"s{i}") for i in range(500)]
    picks = {choose_route([busy, *idle[1:]], NOW, affinity_hash=k) for k in keys}
    assert ENGINES[0] not in picks
    assert picks == set(ENGINES[1:])


# --- measurements -------------------------------------------------------------------------
def warm(latency_ms: float, tps: float | None = None, at: float = NOW) -> Measurement:
    m = None
    for _ in range(8):
        m = record_sample(m, at, latency_ms, 100 if tps else None, 100 / tps if tps else None)
    assert m is not None
    return m


def test_measured_faster_engine_wins_at_equal_load() -> None:
    fast = cand("fast", max_concurrency=4, measurement=warm(100.0))
    slow = cand("slow", max_concurrency=4, measurement=warm(900.0))
    assert choose_route([slow, fast], NOW) == "fast"


def test_long_generations_favor_throughput_short_ones_latency() -> None:
    low_latency = cand("lowlat", measurement=warm(50.0, tps=10.0))
    high_tput = cand("tput", measurement=warm(300.0, tps=200.0))
    assert choose_route([low_latency, high_tput], NOW, max_tokens=1) == "lowlat"
    assert choose_route([low_latency, high_tput], NOW, max_tokens=1000) == "tput"


def test_expired_measurements_fall_back_completely() -> None:
    later = NOW + routing.MEASUREMENT_TTL_S + 1
    m = warm(5000.0)
    assert routing.latency_confidence(m, later) == 0.0
    stale_slow = cand("a-stale", measurement=m)
    other = cand("b-unmeasured")
    # With no live evidence both are plain load-fraction equals; the id breaks the tie.
    assert choose_route([other, stale_slow], later) == "a-stale"


def test_confidence_ramps_over_eight_samples_and_decays_with_age() -> None:
    m = record_sample(None, NOW, 100.0, None, None)
    assert routing.latency_confidence(m, NOW) == pytest.approx(1 / 8)
    full = warm(100.0)
    assert routing.latency_confidence(full, NOW) == 1.0
    half = routing.latency_confidence(full, NOW + routing.MEASUREMENT_HALF_LIFE_S)
    assert half == pytest.approx(0.5)


def test_new_artifact_revision_resets_the_estimator() -> None:
    m = None
    for _ in range(8):
        m = record_sample(m, NOW, 1000.0, None, None, artifact_sha256="a" * 64)
    fresh = record_sample(m, NOW, 10.0, None, None, artifact_sha256="b" * 64)
    assert fresh.latency_ms == 10.0 and fresh.latency_samples == 1.0
    assert fresh.artifact_sha256 == "b" * 64


def test_stream_without_usage_refreshes_latency_not_throughput() -> None:
    m = record_sample(None, NOW, 100.0, 50, 1.0)
    later = record_sample(m, NOW + 100, 100.0, None, None)
    assert later.latency_at == NOW + 100
    assert later.tokens_at == NOW


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0, 1e12])
def test_absurd_latency_samples_are_dropped(bad: float) -> None:
    m = record_sample(None, NOW, bad, None, None)
    assert m.latency_ms is None


OUTCOMES = st.sampled_from(["success", "rate_limited", "failure", "client_error"])


@settings(max_examples=300, deadline=None)
@given(seq=st.lists(st.tuples(OUTCOMES, st.floats(0.0, 5.0)), max_size=30))
def test_breaker_invariants(seq: list[tuple[str, float]]) -> None:
    b, t = CLOSED, 0.0
    streak = 0
    cooldown_until = 0.0  # the last 429's one-second cooldown
    for outcome, gap in seq:
        t += gap
        b = record_outcome(b, outcome, t)  # type: ignore[arg-type]
        if outcome == "success":
            streak, cooldown_until = 0, 0.0
            assert b == CLOSED and not b.is_open(t)
        elif outcome == "rate_limited":
            cooldown_until = t + routing.RATE_LIMIT_COOLDOWN_S
            assert b.is_open(t)
        elif outcome == "failure":
            streak += 1
            expected = streak >= routing.FAILURE_STREAK_TO_OPEN or t < cooldown_until
            assert b.is_open(t) == expected
        assert b.open_until - t <= routing.BREAKER_MAX_S + 1e-9
    # Whatever happened, an open breaker admits a probe once its period has passed.
    later = max(t, b.open_until) + 1e-6
    assert not b.is_open(later)


@given(
    host_state=st.sampled_from(["accepting", "throttled", "draining", "unhealthy"]),
    residency_state=st.sampled_from([None, "ready", "loading", "draining"]),
    admitted=st.booleans(),
    breaker_open=st.booleans(),
    active=st.integers(min_value=0, max_value=10),
    max_concurrency=st.one_of(st.none(), st.integers(min_value=0, max_value=8)),
    multiplier=st.floats(min_value=0.0, max_value=1.0),
    affinity=st.one_of(st.none(), st.just("a" * 64)),
    max_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=4096)),
)
@settings(max_examples=300, deadline=None)
def test_a_single_replica_is_chosen_exactly_when_the_full_ranking_would_choose_it(
    host_state: str,
    residency_state: str | None,
    admitted: bool,
    breaker_open: bool,
    active: int,
    max_concurrency: int | None,
    multiplier: float,
    affinity: str | None,
    max_tokens: int | None,
) -> None:
    """The one-replica shortcut in choose_route (the proxy's common case) decides exactly
    as ranking that replica would: same gates, same admission limit."""
    only = cand(
        "only",
        host_state=host_state,
        residency_state=residency_state,
        admitted=admitted,
        breaker_open=breaker_open,
        active_requests=active,
        max_concurrency=max_concurrency,
        concurrency_multiplier=multiplier,
    )
    ranked = [r for r in routing.estimate_routes([only], NOW, max_tokens) if not r.saturated]
    expected = ranked[0].engine_id if ranked else None
    got = choose_route([only], NOW, max_tokens=max_tokens, affinity_hash=affinity)
    assert got == expected


def test_left_without_replica_names_each_model_no_remaining_engine_can_serve() -> None:
    # After a host is revoked: one model still has a ready engine elsewhere, one only a
    # draining one, one none at all; a model listed twice is named once.
    ready = routing.RouteCandidate(engine_id="e1", host_id="h-good")
    draining = routing.RouteCandidate(engine_id="e2", host_id="h-good", residency_state="draining")
    remaining = {"m-served": [ready], "m-draining": [draining]}
    out = routing.left_without_replica(["m-gone", "m-served", "m-draining", "m-gone"], remaining)
    assert out == ("m-draining", "m-gone")
