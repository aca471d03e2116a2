"""Workload traces: bounded, validated, stretched over the run at the built-in mean."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from grid_core.errors import ValidationError
from grid_core.scenario.arrivals import DemandCurves, builtin_mean
from grid_core.scenario.traces import (
    MAX_TRACE_BYTES,
    MAX_TRACE_ROWS,
    TraceCurve,
    parse_trace,
    rates_from_request_log,
)

AZURE_CODE_RATES = Path(__file__).parent / "data" / "azure_llm_2023_code_rates.csv"
"""Per-minute rates from the Azure LLM inference trace 2023 (CC-BY 4.0): Patel et al.,
"Splitwise", ISCA 2024. See data/README.md."""


def test_a_headerless_two_column_csv_parses_and_ignores_extra_columns() -> None:
    assert parse_trace("coding", b"0,1.5,9\n60,3,9\n120,0\n") == (
        (0.0, 1.5),
        (60.0, 3.0),
        (120.0, 0.0),
    )


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"timestamp,rate\n0,1\n60,2\n", "no header"),
        (b"0,1\n60,-2\n", "negative"),
        (b"0,1\n60,nan\n", "finite"),
        (b"0,1\n60,inf\n", "finite"),
        (b"0,1\n60,2\n60,3\n", "strictly increase"),
        (b"0,1\n30,2\n20,3\n", "strictly increase"),
        (b"0,1\n", "at least 2 rows"),
        (b"0\n60\n", "two columns"),
        (b"0,0\n60,0\n", "every rate before the last row is zero"),
        (b"\xff\xfe\x00", "UTF-8"),
    ],
)
def test_invalid_traces_are_refused_with_the_row(data: bytes, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem) as err:
        parse_trace("coding", data)
    assert "--workload-trace coding" in str(err.value)


def test_a_trace_whose_only_demand_is_its_end_marker_is_refused() -> None:
    with pytest.raises(ValidationError, match="before the last row is zero"):
        parse_trace("coding", b"0,0\n60,0\n120,5\n")


def test_oversize_and_overlong_traces_are_refused() -> None:
    with pytest.raises(ValidationError, match="bytes exceeds"):
        parse_trace("coding", b"0,1\n" + b" " * MAX_TRACE_BYTES)
    rows = "".join(f"{i},1\n" for i in range(MAX_TRACE_ROWS + 1)).encode()
    with pytest.raises(ValidationError, match="rows"):
        parse_trace("coding", rows)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1000.0), min_size=2, max_size=50).filter(lambda r: any(r[:-1])))
@example([0.0, 5e-324, 0.0])  # subnormal rates once underflowed to a zero mean (curve mean 0.5)
def test_a_trace_curve_has_mean_one_over_the_run(rates: list[float]) -> None:
    curve = TraceCurve(tuple((float(i * 60), r) for i, r in enumerate(rates)))
    n = 20_000
    # The last sample only marks the end of the series; the step function covers [0, 1).
    mean = sum(curve.shape((i + 0.5) / n) for i in range(n)) / n
    assert mean == pytest.approx(1.0, rel=0.02, abs=1e-6)


def test_a_trace_replaces_only_its_workload_and_keeps_the_builtin_scale() -> None:
    curves = DemandCurves({"image": ((0.0, 0.0), (50.0, 4.0), (100.0, 4.0))})
    assert curves.replaced == ("image",)
    assert curves.level("image", 0.25) == 0.0  # the first half of the trace is silent
    assert curves.level("image", 0.75) == pytest.approx(2 * builtin_mean("image"), rel=1e-6)
    assert curves.level("coding", 0.25) == DemandCurves().level("coding", 0.25)


def test_the_real_azure_code_trace_replays_at_the_builtin_scale(run) -> None:
    series = parse_trace("coding", AZURE_CODE_RATES.read_bytes())
    assert 50 <= len(series) <= 70  # one hour of per-minute buckets
    builtin = run(duration_s=30 * 60.0)
    replay = run(duration_s=30 * 60.0, traces={"coding": series})
    assert replay["scenario"]["traces"] == ["coding"]
    assert replay["arrivals"]["digest"] != builtin["arrivals"]["digest"]
    coding = replay["demand"]["by_workload"]["coding"]["requests"]
    baseline = builtin["demand"]["by_workload"]["coding"]["requests"]
    assert 0.5 * baseline < coding < 2.0 * baseline  # same offered-demand scale


def test_a_request_log_becomes_per_bucket_rates() -> None:
    log = b"TIMESTAMP,ContextTokens,GeneratedTokens\n" + b"".join(
        f"2023-11-16 18:{m:02d}:{s:02d}.5000000,100,10\n".encode()
        for m, count in ((0, 3), (1, 0), (2, 6))
        for s in range(count)
    )
    rows = parse_trace("coding", rates_from_request_log(log, bucket_s=60.0))
    assert rows == ((0.0, 3 / 60), (60.0, 0.0), (120.0, 6 / 60))


def test_request_log_without_timestamps_is_refused() -> None:
    with pytest.raises(ValidationError, match="timestamps"):
        rates_from_request_log(b"a,b\n1,2\n")
