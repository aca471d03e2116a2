"""Built-in placement score terms (``grid_placement_score_terms``).

Source: specification, "Global placement loop": ready residency > cached weights > another
failure domain > measured throughput > best-fit memory; hardware priors (memory bandwidth,
compute) only break cold ties; measured speed weighs up to 8x more as offered concurrency
exceeds one replica; load, latency, host priority, cold-start time and throttling lower the
score. Magnitudes are spaced so each preference dominates the ones after it at light demand.
"""

from __future__ import annotations

from collections.abc import Callable

from grid_core.api import HostSnapshot, ModelProfile, ScoreContext, ScoreTerm, hookimpl

READY_BONUS = 1000.0
"""A live replica of the model on the host beats everything else."""
CACHED_BONUS = 300.0
"""Exact weights on disk skip the artifact load: worth more than any soft difference below."""
DOMAIN_BONUS = 100.0
"""Spreading across failure domains beats speed at light demand."""
THROUGHPUT_MAX = 40.0
"""Measured speed at 1x weight; at the 8x cap (320) it can amortize a faster cold host."""
THROUGHPUT_REFERENCE_TPS = 100.0
"""Completion tokens/s treated as "fast"; faster hosts saturate the term."""
FULL_CONFIDENCE_SAMPLES = 8.0
"""Measurements ramp to full authority over eight samples."""
HARDWARE_MAX = 2.0
"""Hardware priors only break cold ties (x speed weight, still below the domain bonus)."""
BANDWIDTH_REFERENCE_GBPS = 800.0
COMPUTE_REFERENCE_GFLOPS = 100_000.0
BEST_FIT_MAX = 10.0
"""Leaving less memory unused is a small preference (tightest fit wins among equals)."""
LOAD_PENALTY_MAX = 20.0
LATENCY_PENALTY_PER_S = 2.0
LATENCY_PENALTY_MAX = 20.0
HOST_PRIORITY_PENALTY = 2.0
"""Per unit of host priority: owners who value their machine more see less Grid work."""
COLD_START_PENALTY_PER_MIN = 5.0
COLD_START_PENALTY_MAX = 30.0
THROTTLED_PENALTY = 25.0


class ReadyResidency:
    """Live residency of this model on the host (ready > warming > loading)."""

    name = "ready_residency"
    dynamic = False

    def score(self, model: ModelProfile, host: HostSnapshot, ctx: ScoreContext) -> float:
        res = ctx.resident
        if res is None:
            return 0.0
        return {
            "ready": READY_BONUS,
            "warming": 0.8 * READY_BONUS,
            "loading": 0.6 * READY_BONUS,
        }.get(res.state, 0.0)


class CachedWeights:
    """Exact weights already on the host's disk."""

    name = "cached_weights"
    dynamic = False

    def score(self, model: ModelProfile, host: HostSnapshot, ctx: ScoreContext) -> float:
        return CACHED_BONUS if ctx.cached else 0.0


class FailureDomain:
    """A failure domain that holds no replica of this model yet."""

    name = "failure_domain"
    dynamic = True

    def score(self, model: ModelProfile, host: HostSnapshot, ctx: ScoreContext) -> float:
        return DOMAIN_BONUS if ctx.domain_new else 0.0


class MeasuredThroughput:
    """Server-measured tokens/s of this model on this host, confidence-weighted."""

    name = "measured_throughput"
    dynamic = False

    def score(self, model: ModelProfile, host: HostSnapshot, ctx: ScoreContext) -> float:
        perf = host.performance.get(model.model_id)
        if perf is None or not perf.tokens_per_s:
            return 0.0
        confidence = min(1.0, perf.samples / FULL_CONFIDENCE_SAMPLES)
        speed = min(1.0, perf.tokens_per_s / THROUGHPUT_REFERENCE_TPS)
        return THROUGHPUT_MAX * speed * confidence * ctx.speed_weight


class HardwarePrior:
    """Memory bandwidth and compute, only while nothing is measured (cold tie-break)."""

    name = "hardware_prior"
    dynamic = False

    def score(self, model: ModelProfile, host: HostSnapshot, ctx: ScoreContext) -> float:
        perf = host.performance.get(model.model_id)
        if perf is not None and perf.tokens_per_s and perf.samples > 0:
            return 0.0
        bw = host.memory_bandwidth_gbps or 0.0
        gf = host.compute_gflops or 0.0
        prior = 0.5 * min(1.0, bw / BANDWIDTH_REFERENCE_GBPS) + 0.5 * min(
            1.0, gf / COMPUTE_REFERENCE_GFLOPS
        )
        return HARDWARE_MAX * prior * ctx.speed_weight


class BestFit:
    """Prefer the host the replica fills most tightly (fraction of allocatable left over)."""

    name = "best_fit"
    dynamic = True

    def score(self, model: ModelProfile, host: HostSnapshot, ctx: ScoreContext) -> float:
        if ctx.allocatable_mb <= 0:
            return 0.0
        left = max(0, ctx.free_mb - ctx.memory_mb)
        return -BEST_FIT_MAX * min(1.0, left / ctx.allocatable_mb)


class Penalties:
    """Load, measured latency, host priority, cold start and throttling lower the score."""

    name = "penalties"
    dynamic = False

    def score(self, model: ModelProfile, host: HostSnapshot, ctx: ScoreContext) -> float:
        penalty = 0.0
        conc = host.concurrency or 0
        if host.queue_depth:
            penalty += min(LOAD_PENALTY_MAX, LOAD_PENALTY_MAX * host.queue_depth / max(1, conc))
        perf = host.performance.get(model.model_id)
        if perf is not None and perf.latency_ms:
            penalty += min(LATENCY_PENALTY_MAX, LATENCY_PENALTY_PER_S * perf.latency_ms / 1000)
        penalty += HOST_PRIORITY_PENALTY * max(0, host.host_priority)
        penalty += min(COLD_START_PENALTY_MAX, COLD_START_PENALTY_PER_MIN * ctx.startup_s / 60.0)
        if host.state == "throttled" or host.throttle_fraction < 1.0:
            penalty += THROTTLED_PENALTY
        return -penalty


TERMS: tuple[ScoreTerm, ...] = (
    ReadyResidency(),
    CachedWeights(),
    FailureDomain(),
    MeasuredThroughput(),
    HardwarePrior(),
    BestFit(),
    Penalties(),
)


@hookimpl(trylast=True)
def grid_placement_score_terms(register: Callable[[ScoreTerm], None]) -> None:
    """Register the built-in terms (defaults: a plugin's term of the same name replaces one)."""
    for term in TERMS:
        register(term)
