"""``grid test scenario`` / ``grid test graduate`` through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grid_core.cli import build_app, main
from grid_core.testing import plugins_with

RUNNER = CliRunner()


@pytest.fixture(scope="module")
def app():
    return build_app(
        plugins_with(
            builtins=(
                "grid_lab",
                "grid_forecast_ewma",
                "grid_scoring",
                "grid_victims",
                "grid_classifier",
            )
        )
    )


def _invoke(app, *args: str):
    return RUNNER.invoke(app, ["test", *args])


def test_scenario_json_is_the_complete_stable_report(app) -> None:
    args = (
        "scenario",
        "--machines",
        "3",
        "--models",
        "5",
        "--users",
        "30",
        "--duration",
        "10m",
        "--seed",
        "9",
        "--json",
    )
    first, second = _invoke(app, *args), _invoke(app, *args)
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["scenario"]["machines"] == 3 and report["schema_version"] == 1
    assert {
        "demand",
        "slo",
        "lifecycle",
        "safety",
        "score",
        "timeline",
        "admission_minutes",
        "admission_blocker_minutes",
        "capacity_recommendations",
    } <= set(report)
    assert first.stdout == second.stdout


def test_scenario_summary_and_timeline(app) -> None:
    result = _invoke(
        app,
        "scenario",
        "--machines",
        "2",
        "--models",
        "4",
        "--users",
        "20",
        "--duration",
        "8m",
        "--timeline",
        "--strategy",
        "greedy",
    )
    assert result.exit_code == 0, result.output
    assert "strategy greedy" in result.stdout and "safety:" in result.stdout
    assert "t+   0 min" in result.stdout


def _main_exit(capsys, *args: str) -> tuple[int, str]:
    """Run the real console entry point in-process: exit code and stderr."""
    with pytest.raises(SystemExit) as exc:
        main(["test", *args])
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--machines", "65"), "--machines"),
        (("--models", "0"), "--models"),
        (("--users", "20000"), "--users"),
        (("--duration", "5m"), "--duration"),
        (("--machines", "5", "--oracle"), "--machines"),
        (("--workload-trace", "coding"), "--workload-trace"),
        (("--workload-trace", "poetry=/nonexistent.csv"), "--workload-trace"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(capsys, args, flag) -> None:
    code, err = _main_exit(capsys, "scenario", *args)
    assert code == 2
    assert err.startswith("grid: error: " + flag)
    assert err.count("\n") == 1  # one line, no traceback


@pytest.mark.parametrize("command", ["graduate", "exact"])
def test_a_bad_seed_in_seeds_names_seeds(capsys, command) -> None:
    """graduate and exact take --seeds; the error once named --seed, a flag they lack."""
    code, err = _main_exit(capsys, command, "--machines", "2", "--seeds", "1,-1")
    assert code == 2
    assert err.startswith("grid: error: --seeds: -1 is out of range")


@pytest.mark.parametrize(("flag", "value"), [("--machines", "2,2"), ("--seeds", "7,8,7")])
def test_graduate_refuses_a_value_given_twice(capsys, flag, value) -> None:
    """A repeated size or seed ran its whole cell again only to overwrite the first result."""
    code, err = _main_exit(capsys, "graduate", "--machines", "2", "--seeds", "1", flag, value)
    assert code == 2
    assert err.startswith(f"grid: error: {flag}: ") and "twice" in err


def test_a_generated_trace_replaces_a_workload_curve(app, tmp_path: Path) -> None:
    trace = tmp_path / "image.csv"
    trace.write_text("".join(f"{i * 60},{(i % 5) * 0.2}\n" for i in range(30)))
    result = _invoke(
        app,
        "scenario",
        "--machines",
        "2",
        "--models",
        "4",
        "--users",
        "30",
        "--duration",
        "10m",
        "--workload-trace",
        f"image={trace}",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["scenario"]["traces"] == ["image"]


def test_a_bad_trace_file_is_refused_with_its_row(capsys, tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("0,1\n60,-1\n")
    code, err = _main_exit(capsys, "scenario", "--workload-trace", f"coding={trace}")
    assert code == 2
    assert "row 2" in err and "negative" in err


def test_graduate_prints_every_gate(app) -> None:
    result = _invoke(
        app,
        "graduate",
        "--machines",
        "1,2",
        "--seeds",
        "3",
        "--duration",
        "6m",
        "--models",
        "4",
        "--users",
        "20",
    )
    assert result.exit_code in (0, 1), result.output
    for gate in (
        "smart_safety",
        "identical_demand_traces",
        "bounded_regression",
        "service_gain_over_static",
        "churn_below_greedy",
        "least_workload_largest_fleet",
        "predictive_startup_savings",
    ):
        assert gate in result.stdout
    assert ("FAIL" in result.stdout) == (result.exit_code == 1)
    assert "capacity bound" in result.stdout and "oracle schedule" in result.stdout
    assert "exhaustive" in result.stdout  # 1- and 2-machine fleets are searched exhaustively
    # the per-cell prefetch scorecard is left to --json; its medians stay in the table
    gate_row = next(ln for ln in result.stdout.splitlines() if "predictive_startup" in ln)
    assert '"scorecard": "see --json"' in gate_row and "smart_median" in gate_row
    assert "prefetch_downloads" not in result.stdout


def test_reports_are_identical_across_processes_with_different_hash_seeds() -> None:
    import os
    import subprocess
    import sys

    args = [
        sys.executable,
        "-c",
        "from grid_core.cli import main; main()",
        "test",
        "scenario",
        "--machines",
        "3",
        "--models",
        "5",
        "--users",
        "30",
        "--duration",
        "8m",
        "--seed",
        "11",
        "--json",
    ]
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(args, capture_output=True, env=env, timeout=120, check=True)
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] and json.loads(outputs[0])["demand"]["requests"] > 0
