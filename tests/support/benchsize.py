"""How big the benchmark tier's runs are: smoke size in ``make test``, full size in ``make bench``.

``make test`` runs every benchmark test at smoke size: the same fleets, the same safety and
shape assertions, fewer timed repetitions (the numbers it prints are then only indicative).
``make bench`` sets ``GRID_BENCH_FULL=1`` and repeats each measurement as often as the
benchmark was written for. Wall-clock time is never asserted at either size.
"""

from __future__ import annotations

import os

FULL_ENV = "GRID_BENCH_FULL"
"""Set to ``1`` (``make bench``) for full-size benchmark runs."""


def full_size() -> bool:
    """True when the benchmarks run at full size (``GRID_BENCH_FULL=1``)."""
    return os.environ.get(FULL_ENV) == "1"


def by_size(smoke: int, full: int) -> int:
    """``full`` under ``make bench``, ``smoke`` otherwise (a repetition or request count)."""
    return full if full_size() else smoke
