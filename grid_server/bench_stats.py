"""Statistics of ``grid bench proxy``: percentiles per round, medians over rounds, and spread.

Pure functions over latencies the generators measured; no clock reads, no I/O.

Two views of "what the proxy adds" are computed, because on a shared machine they fail in
different ways:

* **added** (paired, per request): the caller's latency through Grid minus the upstream time
  Grid reports for that same request in its ``Server-Timing: upstream;dur=<ms>`` response
  header (from sending the request to the engine to the engine's response head). The
  upstream interval lies inside the caller's interval, so every sample is >= 0 by
  measurement, not by clipping. It contains Grid's own work and its queueing before the
  upstream request, and the hops to and from Grid. It cannot contain the wait between the
  engine's answer reaching Grid's socket and Grid's event loop reading it (that wait is
  inside the upstream interval), so when Grid's loop is the bottleneck (many clients) it
  understates: read it with the rates and the unpaired view.
* **proxy − direct** (unpaired): a percentile of the proxied latencies minus the same
  percentile of the direct ones, per round. It includes effects the paired view cannot see
  (the proxy's CPU use slowing the engine on the same cores), but two noisy distributions'
  tails can cross; unless every round finds it positive it is reported as within noise
  rather than as a figure.

Each figure is the median over interleaved rounds with the lowest and highest round beside
it, so a reader sees how much the machine moved while it was measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import msgspec

PERCENTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
"""The percentiles every path and every added figure is reported at."""
SERVER_TIMING_METRIC = "upstream"
"""The ``Server-Timing`` metric name Grid's proxy reports its upstream time under."""


class BenchStatsError(ValueError):
    """Measurements the statistics cannot be computed from (empty, unpaired, inconsistent)."""


class Spread(msgspec.Struct, frozen=True):
    """One figure over rounds: the median round and the lowest and highest round.

    Attributes:
        median: median over rounds (same unit as the figure: ms or requests/s).
        low: the lowest round.
        high: the highest round.
    """

    median: float
    low: float
    high: float

    @property
    def within_noise(self) -> bool:
        """For a difference: not every round found it positive.

        The proxy cannot make the engine faster, so a round where the proxied percentile
        beat the direct one is noise (or the proxy pacing the engine), never a negative cost;
        a difference is reported as a figure only when every round agrees it is positive.
        """
        return self.low <= 0.0


class RoundPath(msgspec.Struct, frozen=True):
    """One path (direct or proxied) in one round: percentiles in ms, rate in requests/s."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    rps: float


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation between ranks.

    Raises:
        BenchStatsError: ``values`` is empty or ``q`` is outside 0..1.
    """
    if not values:
        raise BenchStatsError("no latencies to take a percentile of")
    if not 0.0 <= q <= 1.0:
        raise BenchStatsError(f"percentile {q} is outside 0..1")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(values: Sequence[float], digits: int = 3) -> Spread:
    """Median, lowest and highest of per-round ``values`` (rounded to ``digits``).

    Raises:
        BenchStatsError: no rounds.
    """
    if not values:
        raise BenchStatsError("no rounds to summarise")
    return Spread(
        median=round(statistics.median(values), digits),
        low=round(min(values), digits),
        high=round(max(values), digits),
    )


def round_path(latencies_ms: Sequence[float], wall_s: float) -> RoundPath:
    """Percentiles and rate of one path's block.

    Raises:
        BenchStatsError: no latencies, or a wall time that is not positive.
    """
    if wall_s <= 0.0:
        raise BenchStatsError(f"block wall time {wall_s} s is not positive")
    return RoundPath(
        p50_ms=percentile(latencies_ms, PERCENTILES["p50"]),
        p95_ms=percentile(latencies_ms, PERCENTILES["p95"]),
        p99_ms=percentile(latencies_ms, PERCENTILES["p99"]),
        rps=len(latencies_ms) / wall_s,
    )


def paired_added(latencies_ms: Sequence[float], upstream_ms: Sequence[float | None]) -> list[float]:
    """Per request: the caller's latency minus the upstream time Grid reported for it (ms).

    Raises:
        BenchStatsError: the lists differ in length, a response carried no upstream time
            (not answered by Grid's proxy), or an upstream time exceeds its request's latency
            (the two clocks disagree: the paired view would be meaningless).
    """
    if len(latencies_ms) != len(upstream_ms):
        msg = f"{len(latencies_ms)} latencies but {len(upstream_ms)} upstream times"
        raise BenchStatsError(msg)
    added: list[float] = []
    for total, upstream in zip(latencies_ms, upstream_ms, strict=True):
        if upstream is None:
            raise BenchStatsError(
                "a proxied response carried no 'Server-Timing: upstream;dur=' header; "
                "is the target Grid's proxy?"
            )
        if upstream > total:
            msg = f"upstream time {upstream} ms exceeds the request's latency {total} ms"
            raise BenchStatsError(msg)
        added.append(total - upstream)
    return added


def parse_server_timing(value: str | None, metric: str = SERVER_TIMING_METRIC) -> float | None:
    """The ``dur`` (ms) of ``metric`` in a ``Server-Timing`` header value, if present.

    ``'upstream;dur=1.25, db;dur=3'`` gives 1.25 for ``upstream``; a missing header, metric or
    ``dur``, or a ``dur`` that is not a finite non-negative number, gives ``None``.
    """
    if not value:
        return None
    for entry in value.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        if name != metric:
            continue
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip().lower() == "dur":
                try:
                    dur = float(raw.strip().strip('"'))
                except ValueError:
                    return None
                return dur if math.isfinite(dur) and dur >= 0.0 else None
    return None


def interleaved_order(rounds: int) -> list[tuple[str, str]]:
    """Which path goes first in each round: direct/proxy, then proxy/direct, alternating.

    Alternating the order cancels a steady drift in machine load between the two paths
    (an ABBA design), where a fixed order would give one path always the later slot.
    """
    return [("direct", "proxy") if i % 2 == 0 else ("proxy", "direct") for i in range(rounds)]
