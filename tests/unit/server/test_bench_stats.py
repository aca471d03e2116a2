"""The statistics behind ``grid bench proxy``: what the operator reads as "added latency".

Pure functions on made-up latencies; nothing here reads a clock.
"""

from __future__ import annotations

import re

import pytest

from grid_server.bench import RoundMeasure, render_results, summarise
from grid_server.bench_stats import (
    BenchStatsError,
    RoundPath,
    Spread,
    interleaved_order,
    paired_added,
    parse_server_timing,
    percentile,
    round_path,
    spread,
)


def test_percentile_interpolates_between_ranks_and_refuses_nonsense() -> None:
    values = [float(x) for x in range(1, 101)]  # 1..100
    assert percentile(values, 0.5) == pytest.approx(50.5)
    assert percentile(values, 0.99) == pytest.approx(99.01)
    assert percentile(values, 0.0) == 1.0 and percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(BenchStatsError, match="no latencies"):
        percentile([], 0.5)
    with pytest.raises(BenchStatsError, match=r"outside 0\.\.1"):
        percentile(values, 99)


def test_spread_is_median_round_with_lowest_and_highest() -> None:
    s = spread([3.0, 1.0, 10.0, 2.0, 4.0])
    assert (s.median, s.low, s.high) == (3.0, 1.0, 10.0)
    assert not s.within_noise
    assert Spread(median=-1.0, low=-30.0, high=12.0).within_noise
    # Every round negative: the proxy cannot make the engine faster, so still noise.
    assert Spread(median=-1.0, low=-30.0, high=-0.5).within_noise
    assert Spread(median=0.0, low=0.0, high=0.0).within_noise
    with pytest.raises(BenchStatsError):
        spread([])


def test_round_path_rate_and_percentiles() -> None:
    r = round_path([1.0] * 99 + [100.0], wall_s=0.5)
    assert r.rps == 200.0
    assert r.p50_ms == 1.0 and r.p99_ms > r.p95_ms
    with pytest.raises(BenchStatsError, match="not positive"):
        round_path([1.0], wall_s=0.0)


def test_paired_added_is_the_part_of_each_request_outside_the_engine() -> None:
    assert paired_added([5.0, 2.5, 10.0], [4.0, 2.5, 1.0]) == [1.0, 0.0, 9.0]
    with pytest.raises(BenchStatsError, match="no 'Server-Timing"):
        paired_added([5.0, 2.0], [4.0, None])  # a response that did not come through Grid
    with pytest.raises(BenchStatsError, match="exceeds"):
        paired_added([1.0], [2.0])  # an engine time beyond the caller's own: clocks disagree
    with pytest.raises(BenchStatsError, match="2 latencies but 1"):
        paired_added([1.0, 2.0], [0.5])


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("upstream;dur=1.25", 1.25),
        ('cache;desc=hit, upstream;desc=engine;dur="3"', 3.0),
        ("upstream", None),
        ("db;dur=5", None),
        ("upstream;dur=abc", None),
        ("upstream;dur=-1", None),
        ("upstream;dur=inf", None),
        ("", None),
        (None, None),
    ],
)
def test_server_timing_parsing(header: str | None, expected: float | None) -> None:
    assert parse_server_timing(header) == expected


def test_rounds_alternate_which_path_goes_first() -> None:
    assert interleaved_order(4) == [
        ("direct", "proxy"),
        ("proxy", "direct"),
        ("direct", "proxy"),
        ("proxy", "direct"),
    ]


def _round(direct_p99: float, proxy_p99: float, added_p99: float) -> RoundMeasure:
    return RoundMeasure(
        direct=RoundPath(p50_ms=0.3, p95_ms=2.0, p99_ms=direct_p99, rps=1800.0),
        proxy=RoundPath(p50_ms=1.0, p95_ms=3.0, p99_ms=proxy_p99, rps=900.0),
        added={"p50": 0.6, "p95": 1.5, "p99": added_p99},
        proxy_cpu_s=0.1,
        generator_cpu_pct=12.0,
    )


def test_a_noisy_direct_tail_is_reported_as_noise_never_as_negative_added_latency() -> None:
    """The last loaded run printed a 32-client p99 'added' of -29.9 ms because the direct
    path's p99 was noisy. Now the rounds' disagreement is shown as noise, and the added
    figures (paired per request) cannot be negative."""
    rounds = [_round(40.0, 10.0, 4.0), _round(8.0, 11.0, 5.0), _round(9.0, 12.0, 6.0)]
    result = summarise(32, 3000, rounds)
    assert result.proxy_minus_direct_p99_ms.within_noise
    assert result.proxy_minus_direct_p99_ms.low == -30.0
    assert result.proxy_minus_direct_noise == {"p50": False, "p95": False, "p99": True}
    assert result.added_p99_ms == Spread(median=5.0, low=4.0, high=6.0)
    assert result.proxy_rps.median == 900.0 and result.direct_rps.median == 1800.0
    text = render_results([result])
    assert "noise (-30..3)" in text
    row = next(line for line in text.splitlines() if line.startswith("32 "))
    added_cells = re.findall(r"\S+ \([^)]*\)", row)[2:5]  # added p50, p95, p99
    assert added_cells == ["0.6 (0.6..0.6)", "1.5 (1.5..1.5)", "5 (4..6)"]
    assert "load average" in text and "cores" in text


def test_a_busy_generator_is_called_out() -> None:
    busy = RoundMeasure(
        direct=RoundPath(p50_ms=0.3, p95_ms=2.0, p99_ms=3.0, rps=1800.0),
        proxy=RoundPath(p50_ms=1.0, p95_ms=3.0, p99_ms=4.0, rps=900.0),
        added={"p50": 0.6, "p95": 1.5, "p99": 2.0},
        proxy_cpu_s=0.1,
        generator_cpu_pct=95.0,
    )
    result = summarise(64, 500, [busy])
    assert result.generator_busy
    assert "BUSY: a generator process used more than" in render_results([result])
