"""Request routing policy: pick one ready engine for one request (pure, no clock reads).

Source: the specification's "Global placement loop" (request routing, affinity, circuit
breaker and server-owned measurements). The server owns the mutable state (breakers,
measurements, in-flight counts) and passes immutable values plus ``now`` in; everything here
returns values.

Ordering of a route, best first:

1. protection class: an accepting host before a throttled one (others never route);
2. admission: an engine at its concurrency limit (scaled down on a throttled host) never
   receives a new request: the caller waits briefly or gets 503 + Retry-After;
3. estimated completion: active requests plus advertised queue as a fraction of the
   engine's effective concurrency (the "service wave"), multiplied by a confidence- and
   freshness-weighted latency EWMA when measurements for this model exist, plus a
   throughput term for the requested output length;
4. the freshest lease, then the engine id (deterministic).

With an affinity key, rendezvous hashing picks among the best-class routes whose estimate is
within :data:`AFFINITY_SLACK` of the best, so adding or removing an equivalent engine remaps
only the sessions that engine owned.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from grid_core.wire import HostState, ResidencyState

# --- bounds and thresholds ------------------------------------------------------------------
AFFINITY_SLACK = 0.20
"""Routes within 20% of the best estimated completion count as near-equivalent for affinity."""
MAX_AFFINITY_KEY_BYTES = 256
"""Longest accepted affinity key (UTF-8 bytes): a session id, never a document."""
RATE_LIMIT_COOLDOWN_S = 1.0
"""A 429 means 'back off now': one second is enough for llama-server's slots to turn over."""
FAILURE_STREAK_TO_OPEN = 2
"""Two consecutive transport/5xx failures open the breaker; one can be a blip."""
BREAKER_BASE_S = 1.0
"""First open period after a failure streak; doubles on every further failure."""
BREAKER_MAX_S = 30.0
"""Backoff ceiling: a broken engine is re-probed at least twice a minute."""
PROBE_TIMEOUT_S = 30.0
"""A half-open probe that never reports back frees the probe slot after this long."""
EWMA_ALPHA = 0.25
"""Weight of a new sample once the estimator is warm (about an eight-sample memory)."""
FULL_CONFIDENCE_SAMPLES = 8.0
"""Latency and throughput reach full authority after eight relevant samples."""
MEASUREMENT_HALF_LIFE_S = 600.0
"""Confidence halves every ten minutes without a fresh sample of that kind."""
MEASUREMENT_TTL_S = 3600.0
"""After an hour without a sample the evidence is expired and ignored completely."""
MAX_TOKENS_HINT = 1_000_000
"""Upper bound on the max_tokens hint used for the throughput term (ignores absurd values)."""
MAX_LATENCY_MS = 3_600_000.0
"""Latency samples above one hour are not measurements; they are dropped."""
MAX_TOKENS_PER_S = 1e7
"""Throughput samples above this are clock glitches; they are dropped."""

PROTECTION_CLASS: dict[str, int] = {"accepting": 0, "throttled": 1}
"""Host lifecycle → routing class (lower is better). Any other state never routes."""


def protection_class(state: HostState) -> int | None:
    """Routing class of a host lifecycle state: 0 accepting, 1 throttled, ``None`` = closed."""
    return PROTECTION_CLASS.get(state)


# --- measurements -------------------------------------------------------------------------
class Measurement(msgspec.Struct, frozen=True, kw_only=True):
    """Server-owned EWMAs of one model on one engine (private: never exposed in discovery).

    Attributes:
        latency_ms: EWMA of end-to-end latency (milliseconds).
        latency_samples: samples folded into ``latency_ms`` (capped at the confidence ramp).
        latency_at: wall-clock seconds of the last latency sample.
        tokens_per_s: EWMA of completion tokens per second.
        tokens_samples / tokens_at: the same for throughput.
        artifact_sha256: the artifact revision these samples belong to (``None`` = unbound).
    """

    latency_ms: float | None = None
    latency_samples: float = 0.0
    latency_at: float = 0.0
    tokens_per_s: float | None = None
    tokens_samples: float = 0.0
    tokens_at: float = 0.0
    artifact_sha256: str | None = None


def _fold(old: float | None, n: float, sample: float) -> tuple[float, float]:
    if old is None or n <= 0:
        return sample, 1.0
    alpha = max(EWMA_ALPHA, 1.0 / (n + 1.0))
    return old + alpha * (sample - old), min(n + 1.0, FULL_CONFIDENCE_SAMPLES)


def record_sample(
    m: Measurement | None,
    now: float,
    latency_ms: float,
    completion_tokens: int | None,
    generation_s: float | None,
    artifact_sha256: str | None = None,
) -> Measurement:
    """Fold one successful response into the measurement.

    Args:
        m: the current measurement (``None`` = none yet).
        now: wall-clock seconds of the response.
        latency_ms: end-to-end latency (milliseconds); non-finite or absurd values are ignored.
        completion_tokens: completion tokens from the usage block (``None`` when the response
            exposed none: latency is refreshed, throughput keeps its old timestamp).
        generation_s: seconds spent generating (for tokens per second).
        artifact_sha256: revision of the serving residency; a different revision than the
            measurement's resets the estimator (incompatible evidence never blends).

    Returns:
        The new measurement.
    """
    if m is None or (artifact_sha256 is not None and m.artifact_sha256 != artifact_sha256):
        m = Measurement(artifact_sha256=artifact_sha256)
    lat, lat_n, lat_at = m.latency_ms, m.latency_samples, m.latency_at
    if math.isfinite(latency_ms) and 0.0 <= latency_ms <= MAX_LATENCY_MS:
        lat, lat_n = _fold(m.latency_ms, _decayed(m.latency_samples, m.latency_at, now), latency_ms)
        lat_at = now
    tps, tps_n, tps_at = m.tokens_per_s, m.tokens_samples, m.tokens_at
    if completion_tokens and generation_s and generation_s > 0:
        rate = completion_tokens / generation_s
        if math.isfinite(rate) and 0 < rate <= MAX_TOKENS_PER_S:
            tps, tps_n = _fold(m.tokens_per_s, _decayed(m.tokens_samples, m.tokens_at, now), rate)
            tps_at = now
    return Measurement(
        latency_ms=lat,
        latency_samples=lat_n,
        latency_at=lat_at,
        tokens_per_s=tps,
        tokens_samples=tps_n,
        tokens_at=tps_at,
        artifact_sha256=m.artifact_sha256,
    )


def _decayed(samples: float, at: float, now: float) -> float:
    """Effective sample count after freshness decay (0 once expired)."""
    age = max(0.0, now - at)
    if samples <= 0 or age >= MEASUREMENT_TTL_S:
        return 0.0
    return samples * math.pow(0.5, age / MEASUREMENT_HALF_LIFE_S)


def latency_confidence(m: Measurement | None, now: float) -> float:
    """Confidence in [0, 1] of the latency EWMA: sample ramp times freshness."""
    if m is None or m.latency_ms is None:
        return 0.0
    return min(1.0, _decayed(m.latency_samples, m.latency_at, now) / FULL_CONFIDENCE_SAMPLES)


def throughput_confidence(m: Measurement | None, now: float) -> float:
    """Confidence in [0, 1] of the throughput EWMA."""
    if m is None or m.tokens_per_s is None:
        return 0.0
    return min(1.0, _decayed(m.tokens_samples, m.tokens_at, now) / FULL_CONFIDENCE_SAMPLES)


def effective_samples(m: Measurement | None, now: float) -> float:
    """Decayed latency sample count (what placement snapshots call ``samples``)."""
    if m is None:
        return 0.0
    return _decayed(m.latency_samples, m.latency_at, now)


# --- circuit breaker ------------------------------------------------------------------------
BreakerOutcome = Literal["success", "rate_limited", "failure", "client_error"]


class Breaker(msgspec.Struct, frozen=True, kw_only=True):
    """Per-engine, per-model circuit breaker state (monotonic seconds; never persisted).

    Attributes:
        streak: consecutive transport/5xx failures.
        open_until: the route is closed to new requests until this instant.
        probe_started: start of the in-flight half-open probe, ``None`` when there is none.
    """

    streak: int = 0
    open_until: float = 0.0
    probe_started: float | None = None

    def is_open(self, now: float) -> bool:
        """True when the route must not receive a new request at ``now``."""
        if now < self.open_until:
            return True
        # Half-open: one probe at a time; a probe that never reported frees its slot.
        return self.probe_started is not None and now - self.probe_started < PROBE_TIMEOUT_S

    def half_open(self, now: float) -> bool:
        """True when the next request is a probe (the breaker had opened and has expired)."""
        return self.open_until > 0.0 and now >= self.open_until


CLOSED = Breaker()


def begin_request(b: Breaker, now: float) -> Breaker:
    """Mark the probe in flight when a request goes to a half-open route."""
    if b.half_open(now):
        return msgspec.structs.replace(b, probe_started=now)
    return b


def record_outcome(b: Breaker, outcome: BreakerOutcome, now: float) -> Breaker:
    """Next breaker state after one proxied response.

    Args:
        b: current state.
        outcome: ``success`` (2xx) resets; ``rate_limited`` (429) opens for
            :data:`RATE_LIMIT_COOLDOWN_S`; ``failure`` (transport error or 5xx) opens after
            :data:`FAILURE_STREAK_TO_OPEN` in a row with exponential backoff capped at
            :data:`BREAKER_MAX_S`; ``client_error`` (caller-caused 4xx) never counts.
        now: monotonic seconds.

    Returns:
        The new state.
    """
    if outcome == "success":
        return CLOSED
    if outcome == "client_error":
        return msgspec.structs.replace(b, probe_started=None)
    if outcome == "rate_limited":
        # Never shorten a longer backoff that an in-flight 429 reports into.
        return Breaker(streak=b.streak, open_until=max(b.open_until, now + RATE_LIMIT_COOLDOWN_S))
    streak = b.streak + 1
    if streak < FAILURE_STREAK_TO_OPEN:
        return Breaker(streak=streak, open_until=b.open_until)
    backoff = min(BREAKER_MAX_S, BREAKER_BASE_S * 2.0 ** (streak - FAILURE_STREAK_TO_OPEN))
    return Breaker(streak=streak, open_until=max(b.open_until, now + backoff))


# --- Retry-After for a model with no ready engine ---------------------------------------------
MIN_RETRY_AFTER_S = 1
"""Retry-After is whole seconds (RFC 9110); zero would invite a tight retry loop."""
MAX_COLD_RETRY_AFTER_S = 30
"""Longest advised wait for a cold model: clients with a retry budget (the OpenAI client's is
about 10 s) should keep asking rather than give up on a long first load."""
UNKNOWN_STARTUP_RETRY_AFTER_S = 2
"""Advised wait when nothing is planned for the model yet: the next planning pass is at most
a couple of seconds away and may place it on a free host."""


RECLAIM_ALLOWANCE_S = 3.0
"""Seconds a staged eviction adds before the beneficiary can start warming: the drain of an
idle replica, its unload, and the next heartbeat proving the memory free (1 s heartbeats on
the logical fleet; a few seconds of slack on a loaded machine)."""


def cold_retry_after_s(startup_remaining_s: Iterable[float]) -> int:
    """``Retry-After`` for a configured model with no ready engine (whole seconds).

    Args:
        startup_remaining_s: estimated seconds until each replica that is starting or planned
            becomes ready (learned load+warm time of its host minus time already spent);
            empty when nothing is planned.

    Returns:
        The soonest estimate rounded up, within [:data:`MIN_RETRY_AFTER_S`,
        :data:`MAX_COLD_RETRY_AFTER_S`]; :data:`UNKNOWN_STARTUP_RETRY_AFTER_S` without any
        estimate. Non-finite estimates are ignored.
    """
    finite = [s for s in startup_remaining_s if math.isfinite(s)]
    if not finite:
        return UNKNOWN_STARTUP_RETRY_AFTER_S
    soonest = math.ceil(max(0.0, min(finite)))
    return min(MAX_COLD_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, soonest))


# --- upstream answers: whose fault -----------------------------------------------------------
UPSTREAM_NOT_OFFERED = frozenset({404, 405, 501})
"""Engine statuses meaning "this engine does not offer that endpoint" (llama-server answers
501 to ``/v1/embeddings`` when it was started without embeddings): the caller asked for
something the model does not do; the engine is healthy."""
CALLER_ERROR_TYPES = frozenset(
    {"invalid_request_error", "exceed_context_size_error", "not_supported_error"}
)
"""OpenAI-shaped ``error.type`` values that blame the request, whatever the status."""
CONTEXT_LENGTH_PHRASES = (
    "context size",
    "context length",
    "context window",
    "exceeds the available context",
    "too large to process",
    "n_ctx",
    "prompt is too long",
    "too many tokens",
)
"""Phrases engines use when a prompt does not fit (llama-server answered these with 500
before it had a dedicated error type)."""
CALLER_PHRASES = (
    "failed to parse",
    "unsupported param",
    "not supported",
    "does not support",
    "invalid request",
    "invalid value",
    "must be",
)
"""Phrases of an engine's 5xx that name a bad parameter of the request (grammar, JSON
schema, tools without a template): the request is at fault, not the engine."""


class UpstreamVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """Who caused an engine's answer and what the caller receives.

    Attributes:
        breaker: the outcome the engine's circuit breaker records.
        status: the HTTP status the caller receives.
        code: Grid's OpenAI error code when Grid rewrites the answer (``None`` = the engine's
            answer is relayed as it is).
    """

    breaker: BreakerOutcome
    status: int
    code: str | None = None


def classify_upstream(
    status: int, error_type: str | None = None, message: str | None = None
) -> UpstreamVerdict:
    """Classify one engine answer as caller-caused or engine-caused.

    Caller-caused answers never penalise the breaker (source: the specification's circuit
    breaker text, "caller-caused 4xx responses do not poison route health"; issue 16 items 6
    and 10 extend it to 5xx/501 answers that blame the request). Where the engine's answer
    names the request as the cause, the caller gets a 4xx instead of a 5xx.

    Args:
        status: the engine's HTTP status.
        error_type: ``error.type`` of an OpenAI-shaped error body, if any.
        message: ``error.message`` of that body, if any (only searched, never stored).

    Returns:
        The verdict: breaker outcome, caller status and Grid's error code when rewritten.
    """
    if 200 <= status < 300:
        return UpstreamVerdict(breaker="success", status=status)
    if status == 429:
        return UpstreamVerdict(breaker="rate_limited", status=429)
    if status in (401, 403):
        # The engine refused Grid's private key: a registry problem, never the caller's.
        return UpstreamVerdict(breaker="failure", status=502, code="upstream_auth")
    if status in UPSTREAM_NOT_OFFERED:
        return UpstreamVerdict(breaker="client_error", status=400, code="unsupported_endpoint")
    if status < 500:
        return UpstreamVerdict(breaker="client_error", status=status)
    text = (message or "").lower()
    if any(p in text for p in CONTEXT_LENGTH_PHRASES) or error_type == "exceed_context_size_error":
        return UpstreamVerdict(breaker="client_error", status=400, code="context_length_exceeded")
    if error_type in CALLER_ERROR_TYPES or any(p in text for p in CALLER_PHRASES):
        return UpstreamVerdict(breaker="client_error", status=400, code="invalid_request_error")
    return UpstreamVerdict(breaker="failure", status=status)


# --- route choice -------------------------------------------------------------------------
class RouteCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """One engine that claims to serve the requested model.

    Attributes:
        engine_id: registry record id of the engine.
        host_id: stable physical host id.
        host_state: the host's protection lifecycle.
        residency_state: the host's residency state for this model (``None`` = not reported,
            e.g. an external engine).
        admitted: the record is live and authenticated (lease not expired).
        active_requests: requests the proxy has in flight to this engine now.
        max_concurrency: effective concurrency limit (``None`` unknown, 0 closed).
        queue_depth: queued work the engine advertises.
        lease_age_s: seconds since the record's last refresh (server clock; may be negative).
        measurement: server-owned measurement for this model on this engine, if any.
        breaker_open: the circuit breaker refuses new requests now.
        concurrency_multiplier: share of ``max_concurrency`` a throttled host admits
            (its advertised throttle fraction; ignored while the host is accepting).
    """

    engine_id: str
    host_id: str
    host_state: HostState = "accepting"
    residency_state: ResidencyState | None = None
    admitted: bool = True
    active_requests: int = 0
    max_concurrency: int | None = None
    queue_depth: int = 0
    lease_age_s: float = 0.0
    measurement: Measurement | None = None
    breaker_open: bool = False
    concurrency_multiplier: float = 1.0


def admission_limit(c: RouteCandidate) -> int | None:
    """Requests the engine may have in flight at once (``None`` = unknown, no hard limit).

    An engine's concurrency is a hard admission boundary; on a throttled host only the
    advertised fraction of it admits new requests, and at least one request unless the
    fraction is zero (source: the specification's host-protection text, "the advertised
    concurrency multiplier limits new admissions").
    """
    if c.max_concurrency is None:
        return None
    if c.host_state != "throttled" or c.concurrency_multiplier >= 1.0:
        return c.max_concurrency
    if c.concurrency_multiplier <= 0.0 or c.max_concurrency == 0:
        return 0
    return max(1, math.floor(c.max_concurrency * c.concurrency_multiplier))


class RouteEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """Why a route ranks where it does (also shown in tests and debugging output).

    Attributes:
        engine_id: the engine.
        protection: 0 accepting, 1 throttled.
        saturated: active requests already at the hard concurrency limit.
        waves: service waves ahead of this request (1 = starts at once on an idle engine).
        completion: estimated completion (ms when measurements exist, else waves).
        lease_age_s: clamped lease age used as the tie-break.
    """

    engine_id: str
    protection: int
    saturated: bool
    waves: float
    completion: float
    lease_age_s: float

    def key(self) -> tuple[int, bool, float, float, str]:
        """Sort key: best first."""
        return (self.protection, self.saturated, self.completion, self.lease_age_s, self.engine_id)


def eligible(c: RouteCandidate) -> bool:
    """Whether a candidate may receive a request at all (hard gates, fail closed)."""
    if not c.admitted or c.breaker_open:
        return False
    if protection_class(c.host_state) is None:
        return False
    if c.residency_state is not None and c.residency_state != "ready":
        return False
    return c.max_concurrency != 0


def left_without_replica(
    models: Iterable[str], remaining: Mapping[str, Sequence[RouteCandidate]]
) -> tuple[str, ...]:
    """The models of a withdrawn host that no other engine can serve now.

    Args:
        models: the models the withdrawn engines served.
        remaining: model → the route candidates left after the withdrawal (discovery view:
            open breakers ignored, as for ``/v1/models``).

    Returns:
        The models (sorted, each once) with no :func:`eligible` candidate left: requests for
        them are answered 503 ``model_not_ready`` until a replica becomes ready elsewhere.

    Source: the operator's revocation of a host (docs/security.md, "Revoking a host") says
    what it cost rather than refusing to take a last replica away.
    """
    return tuple(
        sorted(m for m in set(models) if not any(eligible(c) for c in remaining.get(m, ())))
    )


def service_waves(c: RouteCandidate) -> float:
    """Work ahead of a new request in units of the engine's concurrency.

    Missing capacity is conservative raw load (capacity 1); zero capacity never gets here.
    """
    capacity = c.max_concurrency if c.max_concurrency else 1
    return 1.0 + (c.active_requests + c.queue_depth) / capacity


def _weighted(value: float | None, conf: float, fallback: float | None) -> float | None:
    if value is None or conf <= 0:
        return fallback
    if fallback is None:
        return value
    return conf * value + (1.0 - conf) * fallback


def estimate_routes(
    candidates: Sequence[RouteCandidate], now: float, max_tokens: int | None = None
) -> list[RouteEstimate]:
    """Estimate every eligible candidate, best first.

    Args:
        candidates: routes serving the requested model (measurements for other models must
            not be passed in).
        now: wall-clock seconds (for measurement freshness).
        max_tokens: the request's max_tokens/max_completion_tokens hint, if any.

    Returns:
        Estimates of eligible candidates sorted best first (empty when none is eligible).
    """
    pool = [c for c in candidates if eligible(c)]
    lats = {c.engine_id: latency_confidence(c.measurement, now) for c in pool}
    tputs = {c.engine_id: throughput_confidence(c.measurement, now) for c in pool}
    known_lat = [
        c.measurement.latency_ms
        for c in pool
        if c.measurement and c.measurement.latency_ms is not None and lats[c.engine_id] > 0
    ]
    known_tps = [
        c.measurement.tokens_per_s
        for c in pool
        if c.measurement and c.measurement.tokens_per_s is not None and tputs[c.engine_id] > 0
    ]
    median_lat = statistics.median(known_lat) if known_lat else None
    median_tps = statistics.median(known_tps) if known_tps else None
    hint = max_tokens if max_tokens and 0 < max_tokens <= MAX_TOKENS_HINT else None
    out: list[RouteEstimate] = []
    for c in pool:
        waves = service_waves(c)
        m = c.measurement
        completion = waves
        if median_lat is not None:
            lat = _weighted(m.latency_ms if m else None, lats[c.engine_id], median_lat)
            completion = waves * float(lat or 0.0)
            if hint is not None and median_tps is not None:
                tps = _weighted(m.tokens_per_s if m else None, tputs[c.engine_id], median_tps)
                if tps:
                    completion += hint / tps * 1000.0
        limit = admission_limit(c)
        saturated = limit is not None and c.active_requests >= limit
        out.append(
            RouteEstimate(
                engine_id=c.engine_id,
                protection=protection_class(c.host_state) or 0,
                saturated=saturated,
                waves=waves,
                completion=completion,
                # A future-dated lease is clamped to zero age: skew cannot buy priority.
                lease_age_s=max(0.0, c.lease_age_s),
            )
        )
    out.sort(key=RouteEstimate.key)
    return out


def hash_affinity_key(raw: str) -> str | None:
    """Hash an ``X-Grid-Affinity-Key`` value at once; ``None`` when it is not acceptable.

    Acceptable: non-empty, printable, at most :data:`MAX_AFFINITY_KEY_BYTES` UTF-8 bytes.
    Only the digest travels further; the raw key is never stored or forwarded.
    """
    if not raw or not raw.isprintable() or len(raw.encode("utf-8")) > MAX_AFFINITY_KEY_BYTES:
        return None
    return hashlib.sha256(b"grid-affinity\0" + raw.encode("utf-8")).hexdigest()


def rendezvous_pick(key_hash: str, engine_ids: Iterable[str]) -> str | None:
    """Highest-random-weight choice of one engine for a session (stable under membership).

    Removing one engine only remaps keys whose top weight was that engine.
    """
    best: tuple[bytes, str] | None = None
    for eid in engine_ids:
        weight = hashlib.blake2b(f"{key_hash}\0{eid}".encode(), digest_size=8).digest()
        if best is None or (weight, eid) > best:
            best = (weight, eid)
    return best[1] if best else None


def choose_route(
    candidates: Sequence[RouteCandidate],
    now: float,
    *,
    max_tokens: int | None = None,
    affinity_hash: str | None = None,
) -> str | None:
    """The engine id that should receive this request, or ``None`` when no route is ready.

    Args:
        candidates: routes serving the requested model.
        now: wall-clock seconds.
        max_tokens: output-length hint (tokens).
        affinity_hash: :func:`hash_affinity_key` of the client's session key.

    Returns:
        An engine id from ``candidates``, or ``None`` when no route is eligible or every
        eligible route is at its admission limit (the request must wait, never pile on).
    """
    if len(candidates) == 1:
        # The common case (one replica): the ranking below would rank this one candidate
        # alone, so only the hard gates and the admission limit decide.
        only = candidates[0]
        if not eligible(only):
            return None
        limit = admission_limit(only)
        return None if limit is not None and only.active_requests >= limit else only.engine_id
    ranked = [r for r in estimate_routes(candidates, now, max_tokens) if not r.saturated]
    if not ranked:
        return None
    best = ranked[0]
    if affinity_hash is None:
        return best.engine_id
    bound = best.completion * (1.0 + AFFINITY_SLACK)
    near = [
        r.engine_id
        for r in ranked
        if r.protection == best.protection
        and r.saturated == best.saturated
        and r.completion <= bound
    ]
    return rendezvous_pick(affinity_hash, near)
