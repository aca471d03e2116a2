"""Bounded demand history: time buckets of aggregate counts, timings and a latency histogram.

Source: specification, "Global placement loop" (bounded time buckets, bursts folded into their
bucket) and "Proactive observation and portfolio planning" (per-bucket logarithmic latency
histogram giving an approximate request-level p95). Nothing here keeps request content.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import msgspec

LATENCY_BASE = 1.25
"""Ratio between adjacent latency bins: p95 is known to within 25 %, plenty for SLO pressure."""
LATENCY_MIN_MS = 1.0
"""Latencies below 1 ms land in bin 0; nothing Grid routes is faster than that."""
LATENCY_BINS = 72
"""1.25**71 ms ≈ 7.6 hours: every plausible latency fits; the histogram never grows beyond this."""
MAX_BUCKETS = 360
"""Hard ceiling on buckets kept per model whatever the policy asks (one hour of 10 s buckets)."""


class ForecastPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Tunables of the demand side (seconds, requests/s, fractions).

    Attributes:
        bucket_s: width of one time bucket.
        window_buckets: buckets kept per model (bounded by :data:`MAX_BUCKETS`).
        ewma_alpha: weight of the newest bucket in the level EWMA.
        trend_alpha: weight of the newest bucket-to-bucket change in the trend EWMA.
        headroom: extra capacity fraction on top of offered concurrency.
        error_pressure: error rate above which one replica beyond the ready set is asked for.
        projection_cap_s: longest horizon rising demand is projected across (5 minutes).
        projection_cap_ratio: projected rate never exceeds this multiple of the level (2x).
        confidence_buckets: buckets with traffic needed before the trend has full weight.
    """

    bucket_s: float = 10.0
    window_buckets: int = 60
    ewma_alpha: float = 0.3
    trend_alpha: float = 0.3
    headroom: float = 0.2
    error_pressure: float = 0.05
    projection_cap_s: float = 300.0
    projection_cap_ratio: float = 2.0
    confidence_buckets: int = 6


class Bucket(msgspec.Struct, kw_only=True, array_like=True):
    """Aggregates of one model over one time bucket (mutable, owned by one series).

    Attributes:
        index: bucket number (``floor(at / bucket_s)``).
        requests: finished requests (every outcome except client errors).
        errors: engine errors and rejections (5xx, transport, 429).
        unavailable: Grid's own "no ready route" answers (demand with no supply).
        service_s: summed engine service time of requests that were served (seconds).
        served: requests that carried a service time.
        queue_s: summed time requests waited before routing (seconds).
        latency: sparse logarithmic histogram, bin index → count (end-to-end latency).
        retried: client retries of requests already counted (not demand: they only show the
            caller is still there, which keeps the model's evidence live).
    """

    index: int
    requests: int = 0
    errors: int = 0
    unavailable: int = 0
    service_s: float = 0.0
    served: int = 0
    queue_s: float = 0.0
    latency: dict[int, int] = {}
    retried: int = 0


class DemandSeries(msgspec.Struct, kw_only=True):
    """A model's bounded bucket history (oldest first), handed to the ``grid_forecast`` hook."""

    model_id: str
    bucket_s: float
    buckets: list[Bucket] = []

    def bucket_at(self, at: float, keep: int) -> Bucket:
        """The bucket covering ``at`` (created on demand); drops buckets beyond ``keep``."""
        index = math.floor(at / self.bucket_s)
        if self.buckets and self.buckets[-1].index == index:
            return self.buckets[-1]
        for b in reversed(self.buckets):  # late arrival: fold into its own bucket if kept
            if b.index == index:
                return b
        bucket = Bucket(index=index, latency={})
        self.buckets.append(bucket)
        self.buckets.sort(key=lambda b: b.index)
        limit = min(keep, MAX_BUCKETS)
        if len(self.buckets) > limit:
            del self.buckets[: len(self.buckets) - limit]
        return bucket

    def prune(self, now: float, keep: int) -> None:
        """Drop buckets older than the window ending at ``now``."""
        oldest = math.floor(now / self.bucket_s) - min(keep, MAX_BUCKETS) + 1
        self.buckets = [b for b in self.buckets if b.index >= oldest]


class Forecast(msgspec.Struct, frozen=True, kw_only=True):
    """What a forecaster returns for one model (rates in requests/s, times in seconds).

    Attributes:
        rate_rps: near-term arrival rate (level).
        trend_rps: change of the rate per second (requests/s per second); may be negative.
        confidence: 0..1, how much the trend may be trusted.
        service_time_s: measured mean service time, ``None`` when nothing was served.
        queued: mean requests waiting before routing (Little's law on queue time).
        p95_ms: approximate request-level p95 end-to-end latency, ``None`` without samples.
        error_rate: fraction of requests that failed on the engine side.
        unavailable_rps: rate of requests Grid answered with "no ready route".
    """

    rate_rps: float
    trend_rps: float = 0.0
    confidence: float = 0.0
    service_time_s: float | None = None
    queued: float = 0.0
    p95_ms: float | None = None
    error_rate: float = 0.0
    unavailable_rps: float = 0.0


@runtime_checkable
class Forecaster(Protocol):
    """Forecasts one model's near-term demand (``grid_forecast``, firstresult)."""

    def __call__(self, series: DemandSeries, now: float, policy: ForecastPolicy) -> Forecast | None:
        """The model's forecast, or ``None`` to let the next forecaster answer.

        Args:
            series: the model's bounded bucket history.
            now: planning instant (Unix seconds).
            policy: bucket width, smoothing factors and window.
        """
        ...


class ForecastSource(Protocol):
    """Whatever answers ``grid_forecast`` for the demand tracker (the plugin facade does)."""

    def forecast(self, series: DemandSeries, now: float, policy: ForecastPolicy) -> Forecast | None:
        """The first forecaster's answer for ``series``, or ``None`` when none answers."""
        ...


def latency_bin(ms: float) -> int:
    """Histogram bin of a latency in ms (bounded to ``[0, LATENCY_BINS)``)."""
    if not math.isfinite(ms) or ms <= LATENCY_MIN_MS:
        return 0
    return min(LATENCY_BINS - 1, int(math.log(ms / LATENCY_MIN_MS, LATENCY_BASE)) + 1)


def bin_upper_ms(index: int) -> float:
    """Upper edge of a bin in ms (the conservative value reported for a percentile)."""
    return LATENCY_MIN_MS * LATENCY_BASE**index


def percentile_ms(histograms: list[dict[int, int]], q: float = 0.95) -> float | None:
    """Approximate request-level percentile over several bucket histograms.

    Args:
        histograms: sparse bin → count maps (one per bucket).
        q: quantile in (0, 1].

    Returns:
        The upper edge (ms) of the bin holding the ``q``-th request, or ``None`` when empty.
        One slow request among 99 fast ones stays a tail sample and does not move p95.
    """
    merged: dict[int, int] = {}
    for hist in histograms:
        for k, v in hist.items():
            merged[k] = merged.get(k, 0) + v
    total = sum(merged.values())
    if total == 0:
        return None
    rank = math.ceil(q * total)
    seen = 0
    for k in sorted(merged):
        seen += merged[k]
        if seen >= rank:
            return bin_upper_ms(k)
    return bin_upper_ms(max(merged))  # pragma: no cover - rank <= total always hits above
