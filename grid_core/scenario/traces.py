"""Real request-rate traces that replace one workload's demand curve.

The format is a headerless CSV whose first two columns are a timestamp in seconds and a
request rate; extra columns are ignored. A trace is bounded (5 MiB, 100,000 rows), must have
finite non-negative rates and strictly increasing timestamps, and is stretched over the
scenario's duration with its mean scaled to the built-in curve's mean, so a trace changes
burst timing but not the offered-demand scale (specification: scenario lab, production-shaped
replay). Reading the file is the caller's job (the CLI); this module parses bytes.
"""

from __future__ import annotations

import bisect
import math

from grid_core.errors import ValidationError

MAX_TRACE_BYTES = 5 * 1024 * 1024
"""5 MiB: a day of per-second rates fits with room; larger files are refused, not truncated."""
MAX_TRACE_ROWS = 100_000
"""More than a day of per-second samples; a bigger series is refused."""
MIN_TRACE_ROWS = 2
"""One point has no shape to replay."""

Series = tuple[tuple[float, float], ...]


def _bad(workload: str, where: str, problem: str) -> ValidationError:
    return ValidationError(f"--workload-trace {workload}: {where}: {problem}")


def parse_trace(workload: str, data: bytes) -> Series:
    """Parse and validate one trace.

    Args:
        workload: the workload it replaces (only used in error messages).
        data: the CSV bytes.

    Returns:
        ``((timestamp_s, rate), ...)`` with strictly increasing timestamps.

    Raises:
        ValidationError: oversize, too many rows, a malformed/non-finite/negative value or
            a timestamp that does not increase; the message names the row.
    """
    if len(data) > MAX_TRACE_BYTES:
        raise _bad(
            workload,
            "file",
            f"{len(data)} bytes exceeds {MAX_TRACE_BYTES}; resample it to fewer rows",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(workload, "file", "is not UTF-8 text; give a CSV") from None
    rows: list[tuple[float, float]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(rows) >= MAX_TRACE_ROWS:
            raise _bad(workload, "file", f"more than {MAX_TRACE_ROWS} rows; resample it")
        cells = line.split(",")
        if len(cells) < 2:
            raise _bad(workload, f"row {n}", "needs two columns: timestamp seconds, rate")
        try:
            ts, rate = float(cells[0]), float(cells[1])
        except ValueError:
            raise _bad(
                workload,
                f"row {n}",
                "timestamp and rate must be numbers (the file must have no header)",
            ) from None
        if not (math.isfinite(ts) and math.isfinite(rate)):
            raise _bad(workload, f"row {n}", "values must be finite")
        if rate < 0:
            raise _bad(workload, f"row {n}", f"rate {rate:g} is negative")
        if rows and ts <= rows[-1][0]:
            raise _bad(workload, f"row {n}", "timestamps must strictly increase")
        rows.append((ts, rate))
    if len(rows) < MIN_TRACE_ROWS:
        raise _bad(workload, "file", f"needs at least {MIN_TRACE_ROWS} rows")
    # The last row only marks where the series ends; the rates before it carry the demand.
    if not any(r for _, r in rows[:-1]):
        raise _bad(workload, "file", "every rate before the last row is zero; nothing to replay")
    return tuple(rows)


class TraceCurve:
    """A trace mapped onto ``[0, 1)`` of the scenario with mean rate 1.0.

    ``shape(x)`` multiplies the built-in curve's mean, so the offered demand stays on the
    same scale as the built-in workday.
    """

    def __init__(self, series: Series) -> None:
        t0, t1 = series[0][0], series[-1][0]
        self._xs = [(t - t0) / (t1 - t0) for t, _ in series]
        # Rates are scaled by the peak first, so a trace of tiny (even subnormal) rates keeps
        # its shape instead of underflowing to a zero mean.
        peak = max(r for _, r in series[:-1])
        self._rates = [r / peak for _, r in series]
        # Time-weighted mean of the step function, so uneven sampling does not bias it.
        total = sum(
            self._rates[i] * (self._xs[i + 1] - self._xs[i]) for i in range(len(self._xs) - 1)
        )
        self._mean = total if total > 0 else 1.0

    def shape(self, x: float) -> float:
        """Relative rate at fraction ``x`` of the run (step interpolation, mean 1.0)."""
        i = max(0, bisect.bisect_right(self._xs, x) - 1)
        return self._rates[i] / self._mean


def rates_from_request_log(data: bytes, bucket_s: float = 60.0) -> bytes:
    """Turn a per-request log with a ``YYYY-MM-DD HH:MM:SS.fff`` first column into a trace.

    Useful for public request logs such as the Azure LLM inference trace 2023
    (CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024): each bucket becomes one row of
    ``seconds,requests_per_second``. A header row is skipped.

    Raises:
        ValidationError: no timestamps could be read.
    """
    from datetime import datetime

    stamps: list[float] = []
    for line in data.decode("utf-8", "replace").splitlines():
        cell = line.split(",", 1)[0].strip()
        try:
            stamp = datetime.fromisoformat(cell[:26])
        except ValueError:
            continue
        stamps.append(stamp.timestamp())
    if not stamps:
        msg = "request log: no 'YYYY-MM-DD HH:MM:SS' timestamps in the first column"
        raise ValidationError(msg)
    t0 = min(stamps)
    buckets: dict[int, int] = {}
    for s in stamps:
        k = int((s - t0) // bucket_s)
        buckets[k] = buckets.get(k, 0) + 1
    last = max(buckets)
    rows = [f"{k * bucket_s:g},{buckets.get(k, 0) / bucket_s:.6f}" for k in range(last + 1)]
    return ("\n".join(rows) + "\n").encode()
