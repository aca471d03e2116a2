"""Graduation gates: pass/fail with the failing numbers; the matrix runs to completion."""

from __future__ import annotations

from grid_core.scenario.config import ScenarioConfig
from grid_core.scenario.graduate import evaluate_gates, graduate

GATES = {
    "smart_safety",
    "identical_demand_traces",
    "bounded_regression",
    "service_gain_over_static",
    "churn_below_greedy",
    "least_workload_largest_fleet",
    "predictive_startup_savings",
}


def _row(strategy: str, **kw) -> dict:
    row = {
        "machines": 4,
        "seed": 1,
        "strategy": strategy,
        "score": 0.8,
        "served": 0.8,
        "violations": 0,
        "digest": "d",
        "mutations": 10,
        "least_workload": "video",
        "least_served": 0.5,
        "least_requests": 10,
        "least_served_requests": 5,
        "wait_minutes": 10,
    }
    row.update(kw)
    return row


def _good_smart(**kw) -> dict:
    """A smart row that passes every gate against the default baseline rows."""
    return _row("smart", **{"served": 0.9, "score": 0.9, "mutations": 5, "wait_minutes": 5, **kw})


def _gates(rows: list[dict]) -> dict[str, dict]:
    return {g["gate"]: g for g in evaluate_gates(rows, 4)}


def test_a_good_matrix_passes_every_gate() -> None:
    rows = [
        _good_smart(),
        _row("reactive"),
        _row("greedy", mutations=40),
        _row("static"),
    ]
    gates = _gates(rows)
    assert set(gates) == GATES
    assert all(g["pass"] for g in gates.values()), gates


def test_each_gate_fails_on_its_own_evidence() -> None:
    rows = [
        _row(
            "smart",
            violations=2,
            served=0.5,
            score=0.5,
            mutations=30,
            least_served=0.0,
            wait_minutes=50,
        ),
        _row("reactive", digest="other"),
        _row("greedy", mutations=40),
        _row("static"),
    ]
    gates = _gates(rows)
    assert not any(g["pass"] for g in gates.values())
    assert gates["smart_safety"]["measured"] == {"violations": 2}
    assert "vs static" in " ".join(gates["bounded_regression"]["failing"])
    assert gates["churn_below_greedy"]["measured"] == {"smart_median": 30, "greedy_median": 40}


def test_the_matrix_runs_to_completion(lab) -> None:
    base = ScenarioConfig(models=5, users=30, duration_s=8 * 60.0)
    result = graduate((1, 2), (5,), base, lab)
    assert len(result["runs"]) == 8
    assert {g["gate"] for g in result["gates"]} == GATES
    identical = next(g for g in result["gates"] if g["gate"] == "identical_demand_traces")
    assert identical["pass"]
    assert result["passed"] == all(g["pass"] for g in result["gates"])
    # One oracle row per cell: smart against the proven bounds (never above them).
    assert [(r["machines"], r["seed"]) for r in result["oracle"]] == [(1, 5), (2, 5)]
    for row in result["oracle"]:
        assert row["smart"] <= row["oracle_bound"] <= row["capacity_bound"]
        assert row["oracle_schedule"] <= row["oracle_bound"]
        assert row["oracle_exact"] is True
        assert row["gap_to_oracle_bound"] == round(row["oracle_bound"] - row["smart"], 6)


def test_predictive_savings_fail_when_a_cell_shows_no_effect_of_prediction() -> None:
    """Lower median waits are not enough: a cell where smart and reactive are identical
    shows prediction did nothing there."""
    rows = [
        _good_smart(),
        _row("reactive"),
        _row("greedy", mutations=40),
        _row("static"),
    ]
    other = [dict(r, seed=2) for r in rows]
    other[1] = dict(other[0], strategy="reactive")  # identical to smart in seed 2
    gate = _gates(rows + other)["predictive_startup_savings"]
    assert not gate["pass"]
    assert gate["failing"] == ["machines=4 seed=2: smart and reactive identical"]


def test_a_failing_churn_or_prediction_gate_says_which_bound_it_missed() -> None:
    """'smart 2 vs greedy 3' read as a pass; the failure must name the bound it missed."""
    from grid_core.scenario.graduate import CHURN_RATIO, _churn_gate, _prediction_gate

    key = (2, 1)
    churn = _churn_gate({key: {"mutations": 2}}, {key: {"mutations": 3}}, [key])
    assert not churn["pass"]
    assert churn["failing"] == [f"smart 2 > {CHURN_RATIO} x greedy 3 = {CHURN_RATIO * 3}"]
    smart = {key: {"wait_minutes": 4, "score": 1.0, "served": 1.0, "mutations": 2}}
    reactive = {key: {"wait_minutes": 4, "score": 0.5, "served": 1.0, "mutations": 2}}
    prediction = _prediction_gate(smart, reactive, [key])
    assert prediction["failing"][0] == "smart 4 is not below reactive 4"


def test_a_failing_least_workload_cell_names_the_baseline_and_the_request_counts() -> None:
    """'smart 0.727 vs best baseline 0.909' hid who won and that the miss was 2 requests of
    11: the failing cell names the winning baseline and each side's counts."""
    rows = [
        _good_smart(least_served=0.727273, least_requests=11, least_served_requests=8),
        _row("reactive", least_served=0.909091, least_requests=11, least_served_requests=10),
        _row(
            "greedy",
            mutations=40,
            least_served=0.090909,
            least_requests=11,
            least_served_requests=1,
        ),
        _row(
            "static",
            least_workload="embedding",
            least_served=0.8,
            least_requests=20,
            least_served_requests=16,
        ),
    ]
    gate = _gates(rows)["least_workload_largest_fleet"]
    assert not gate["pass"]
    assert gate["failing"] == [
        "seed=1: smart video 8/11 (0.727273) vs best baseline reactive video 10/11 (0.909091)"
    ]
    assert gate["measured"]["seed=1"] == {
        "smart": 0.727273,
        "best_baseline": 0.909091,
        "best_baseline_strategy": "reactive",
    }


def test_a_failing_regression_cell_names_only_the_measure_over_its_bound() -> None:
    """'smart trails by -0.052 score, +0.088 served' read as if smart trailed on both: the
    failing cell gives both values of the measure that is over its bound, and only that."""
    rows = [
        _good_smart(score=0.812, served=0.700),
        _row("reactive", score=0.7, served=0.7),
        _row("greedy", score=0.760, served=0.788, mutations=40),
        _row("static", score=0.7, served=0.6),
    ]
    gate = _gates(rows)["bounded_regression"]
    assert not gate["pass"]
    assert gate["failing"] == [
        "machines=4 seed=1 vs greedy: smart served 0.700 vs 0.788 (trails by 0.088 > 0.05)"
    ]


def test_a_difference_exactly_at_a_bound_is_within_it() -> None:
    """The runs report fractions to six places; 1.0 - 0.95 is 0.050000000000000044 and
    0.82 - 0.80 is 0.019999999999999907 in floating point. A gate compares the reported
    numbers, so a difference of exactly the bound passes."""
    rows = [
        # 19/20 against 20/20 served: trails by exactly 0.05.
        _row("smart", score=0.95, served=0.95, mutations=5, wait_minutes=5, least_served=0.85),
        _row("reactive", score=1.0, served=1.0, least_served=0.9),
        _row("greedy", score=0.8, served=0.8, mutations=40, least_served=0.5),
        _row("static", score=0.8, served=0.93, least_served=0.5),
    ]
    gates = _gates(rows)
    assert gates["bounded_regression"]["pass"], gates["bounded_regression"]
    assert gates["least_workload_largest_fleet"]["pass"], gates["least_workload_largest_fleet"]
    assert gates["service_gain_over_static"]["pass"], gates["service_gain_over_static"]


def test_a_deficit_just_over_its_bound_reads_as_over_it() -> None:
    """'trails by 0.050 > 0.05' contradicts itself: the failing cell shows as many places as
    it takes for the deficit to read as over the bound, and the values to the same places."""
    rows = [
        _row("smart", score=0.9, served=0.9496, mutations=5, wait_minutes=5),
        _row("reactive", score=0.9, served=1.0),
        _row("greedy", score=0.8, served=0.8, mutations=40),
        _row("static", score=0.8, served=0.8),
    ]
    gate = _gates(rows)["bounded_regression"]
    assert gate["failing"] == [
        "machines=4 seed=1 vs reactive: smart served 0.9496 vs 1.0000 (trails by 0.0504 > 0.05)"
    ]
