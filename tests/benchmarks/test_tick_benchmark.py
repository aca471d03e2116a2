"""Controller tick benchmark: prints p50/p90 per fleet; asserts only behaviour, never time.

``GRID_BENCH_FLEETS`` may name a folder of generated ``grid-bench-fleet/1`` files; otherwise
the planner benchmark's small built-in fleet builder writes 64x32 fleets to a temp dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from benchsize import by_size
from grid_bench.fleet_make import make_fleet
from grid_bench.tick import run_tick_bench
from typer.testing import CliRunner

from grid_core.cli import build_app
from grid_core.reconcile.policy import MAX_GLOBAL_MUTATIONS
from grid_core.testing import plugins_with

pytestmark = pytest.mark.benchmark


def _files(tmp_path: Path) -> list[Path]:
    folder = os.environ.get("GRID_BENCH_FLEETS")
    if folder:
        return sorted(Path(folder).glob("*.json"))
    out = []
    for occupancy in (0.0, 0.5):
        p = tmp_path / f"fleet-64x32-o{occupancy}.json"
        p.write_text(json.dumps(make_fleet(64, 32, 1, occupancy)))
        out.append(p)
    return out


def test_tick_bench_numbers_and_governed_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = []
    for path in _files(tmp_path):
        out = run_tick_bench(path, runs=by_size(smoke=2, full=5))
        assert {"p50_ms", "p90_ms"} <= set(out)
        # A load and its warm are one replica lifecycle: at most two actions per slot.
        assert out["pending"] <= 2 * MAX_GLOBAL_MUTATIONS  # type: ignore[operator]
        assert out["state_bytes"] > 0  # every automatic tick was persisted to a real file
        rows.append(
            f"{path.name}: p50={out['p50_ms']}ms p90={out['p90_ms']}ms "
            f"pending={out['pending']} deferred={out['deferred']}"
        )
    with capsys.disabled():
        print("\n" + "\n".join(rows))


def test_cli_json_reports_p50_and_p90(tmp_path: Path) -> None:
    p = tmp_path / "fleet.json"
    p.write_text(json.dumps(make_fleet(8, 4, 3, 0.5)))
    app = build_app(
        plugins_with(builtins=("grid_bench", "grid_scoring", "grid_victims", "grid_forecast_ewma"))
    )
    result = CliRunner().invoke(app, ["bench", "tick", "--fleet", str(p), "--json", "--runs", "2"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["runs"] == 2 and out["hosts"] == 8 and out["models"] == 4
    assert out["p50_ms"] > 0 and out["p90_ms"] >= out["p50_ms"]
