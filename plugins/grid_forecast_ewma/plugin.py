"""Built-in forecaster: bucketed EWMA level plus a positive-only-for-scale-up trend.

Source: specification, "Global placement loop" (a bucketed EWMA and a positive trend term make
the near-term forecast). Answers the ``grid_forecast`` hook (firstresult) as the default:
``trylast`` lets any other installed forecaster answer first.
"""

from __future__ import annotations

import math

from grid_core.api import DemandSeries, Forecast, ForecastPolicy, hookimpl, percentile_ms


def ewma_forecast(series: DemandSeries, now: float, policy: ForecastPolicy) -> Forecast:
    """EWMA over per-bucket rates (oldest to newest, empty buckets count as zero traffic).

    Completed buckets feed the EWMA; the still-filling bucket can only raise the level (its
    count over the full width), so a burst folds into its bucket and shows at once while a
    just-started, still-empty bucket cannot drag the level down. The trend is an EWMA of
    bucket-to-bucket level changes (requests/s per second); confidence grows with the number of
    buckets that saw traffic.

    Args:
        series: bounded bucket history of one model.
        now: planning instant (Unix seconds).
        policy: bucket width, smoothing factors, window.

    Returns:
        The model's :class:`~grid_core.api.Forecast`.
    """
    width = series.bucket_s
    current = math.floor(now / width)
    first = current - policy.window_buckets + 1
    by_index = {b.index: b for b in series.buckets if first <= b.index <= current}
    if not by_index:
        return Forecast(rate_rps=0.0)
    start = min(by_index)
    level: float | None = None
    trend = 0.0
    for index in range(start, current):  # completed buckets only
        b = by_index.get(index)
        rate = (b.requests / width) if b is not None else 0.0
        if level is None:
            level = rate
            continue
        new_level = policy.ewma_alpha * rate + (1 - policy.ewma_alpha) * level
        slope = (new_level - level) / width
        trend = policy.trend_alpha * slope + (1 - policy.trend_alpha) * trend
        level = new_level
    filling = by_index.get(current)
    if filling is not None:
        # The filling bucket's count over its full width never overstates its rate; a
        # burst therefore raises the level at once without a half-elapsed bucket lowering it.
        level = max(level or 0.0, filling.requests / width)
    buckets = list(by_index.values())
    requests = sum(b.requests for b in buckets)
    served = sum(b.served for b in buckets)
    window_s = width * (current - start + 1)
    active = sum(1 for b in buckets if b.requests)
    return Forecast(
        rate_rps=level or 0.0,
        trend_rps=trend,
        confidence=min(1.0, active / max(1, policy.confidence_buckets)),
        service_time_s=(sum(b.service_s for b in buckets) / served) if served else None,
        queued=sum(b.queue_s for b in buckets) / window_s,
        p95_ms=percentile_ms([b.latency for b in buckets]),
        error_rate=(sum(b.errors for b in buckets) / requests) if requests else 0.0,
        unavailable_rps=sum(b.unavailable for b in buckets) / window_s,
    )


@hookimpl(trylast=True)
def grid_forecast(series: DemandSeries, now: float, policy: ForecastPolicy) -> Forecast | None:
    """Answer with the EWMA forecast of ``series``."""
    return ewma_forecast(series, now, policy)
