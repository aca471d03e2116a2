"""Whose fault an engine's answer is, and what the caller and the breaker make of it."""

from __future__ import annotations

import math

import pytest

from grid_core.routing import (
    CLOSED,
    MAX_COLD_RETRY_AFTER_S,
    MIN_RETRY_AFTER_S,
    UNKNOWN_STARTUP_RETRY_AFTER_S,
    classify_upstream,
    cold_retry_after_s,
    record_outcome,
)


@pytest.mark.parametrize(
    ("status", "kind", "message"),
    [
        # llama-server before its dedicated error type: a prompt that does not fit is a 500.
        (500, "server_error", "the request exceeds the available context size, try increasing it"),
        (500, None, "input is too large to process. increase the physical batch size"),
        (400, "exceed_context_size_error", "the request exceeds the available context size"),
        (500, "server_error", "Failed to parse grammar"),
        (500, "invalid_request_error", "anything"),
        (501, "not_supported_error", "This server does not support embeddings."),
        (404, "not_found_error", "File Not Found"),
        (400, "invalid_request_error", "'messages' must be a list"),
        (422, None, None),
    ],
)
def test_caller_caused_answers_never_penalise_the_breaker(
    status: int, kind: str | None, message: str | None
) -> None:
    verdict = classify_upstream(status, kind, message)
    assert verdict.breaker == "client_error"
    assert 400 <= verdict.status < 500
    # However many of them arrive, the breaker stays closed.
    b = CLOSED
    for t in range(10):
        b = record_outcome(b, verdict.breaker, float(t))
        assert not b.is_open(float(t))


def test_caller_caused_5xx_reaches_the_caller_as_a_4xx_with_a_code() -> None:
    v = classify_upstream(500, "server_error", "the request exceeds the available context size")
    assert (v.status, v.code) == (400, "context_length_exceeded")
    v = classify_upstream(501, None, "This server does not support embeddings")
    assert (v.status, v.code) == (400, "unsupported_endpoint")
    # A 4xx the engine already sent is relayed unchanged.
    assert classify_upstream(400, "invalid_request_error", "bad").code is None


@pytest.mark.parametrize(
    ("status", "message"),
    [(500, "llama_decode failed"), (503, "Loading model"), (502, None), (500, None)],
)
def test_engine_caused_answers_count_against_the_engine(status: int, message: str | None) -> None:
    v = classify_upstream(status, "server_error", message)
    assert v.breaker == "failure" and v.status == status and v.code is None
    b = record_outcome(record_outcome(CLOSED, v.breaker, 0.0), v.breaker, 0.0)
    assert b.is_open(0.5)


def test_a_refused_engine_key_is_grids_problem_not_the_callers() -> None:
    for status in (401, 403):
        v = classify_upstream(status, "authentication_error", "Invalid API Key")
        assert (v.breaker, v.status, v.code) == ("failure", 502, "upstream_auth")


def test_429_is_rate_limited_and_2xx_success() -> None:
    assert classify_upstream(429).breaker == "rate_limited"
    assert classify_upstream(200).breaker == "success"


def test_cold_retry_after_follows_the_soonest_startup_within_bounds() -> None:
    assert cold_retry_after_s([0.3]) == MIN_RETRY_AFTER_S
    assert cold_retry_after_s([4.2, 1.2]) == 2
    assert cold_retry_after_s([-5.0]) == MIN_RETRY_AFTER_S  # overdue: ask again soon
    assert cold_retry_after_s([900.0]) == MAX_COLD_RETRY_AFTER_S
    assert cold_retry_after_s([]) == UNKNOWN_STARTUP_RETRY_AFTER_S
    assert cold_retry_after_s([math.nan, math.inf]) == UNKNOWN_STARTUP_RETRY_AFTER_S
