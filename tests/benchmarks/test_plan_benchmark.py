"""Planner benchmark: prints p50/p90 per fleet; asserts only placement safety, never time.

Fleets are the neutral ``grid-bench-fleet/1`` format. Set ``GRID_BENCH_FLEETS`` to a folder of
generated files (for example the generator's seeds 1 and 2 at occupancy 0 and 0.5) to time
those; otherwise ``grid bench fleet``'s generator writes 64x32 and 256x64 fleets to a temp dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from benchsize import by_size
from grid_bench.fleet import fleet_inputs, load_fleet, overcommitted_hosts, violations
from grid_bench.fleet_make import make_fleet
from grid_bench.plan_bench import run_plan_bench
from typer.testing import CliRunner

from grid_core.cli import build_app, main
from grid_core.testing import plugins_with

pytestmark = pytest.mark.benchmark

KEYS = {
    "p50_ms",
    "p90_ms",
    "cpu_p50_ms",
    "evictions",
    "desired",
    "placed",
    "unsatisfied",
    "coverage",
    "overcommitted_hosts",
    "violations",
    "unmet",
    "assignments",
    "planner_build",
    "planner_build_reason",
}


def _fleet_files(tmp_path: Path) -> list[Path]:
    folder = os.environ.get("GRID_BENCH_FLEETS")
    if folder:
        return sorted(Path(folder).glob("*.json"))
    out = []
    for hosts, models in ((64, 32), (256, 64)):
        for seed in (1, 2):
            for occupancy in (0.0, 0.5):
                p = tmp_path / f"fleet-{hosts}x{models}-s{seed}-o{occupancy}.json"
                p.write_text(json.dumps(make_fleet(hosts, models, seed, occupancy)))
                out.append(p)
    return out


def test_plan_bench_numbers_and_safety(tmp_path, capsys):
    rows = []
    for path in _fleet_files(tmp_path):
        out = run_plan_bench(path, runs=by_size(smoke=1, full=3))
        assert set(out) >= KEYS
        assert out["overcommitted_hosts"] == 0
        assert out["violations"] == 0, out["violation_kinds"]
        assert out["placed"] == len(out["assignments"])
        assert out["unsatisfied"] == out["desired"] - out["placed"]
        rows.append(
            f"{path.name}: p50={out['p50_ms']}ms p90={out['p90_ms']}ms "
            f"desired={out['desired']} placed={out['placed']}"
        )
    with capsys.disabled():
        print("\n" + "\n".join(rows))


def test_overcommit_check_is_independent_and_catches_a_bad_placement(tmp_path):
    data = make_fleet(4, 3, 7, 0.0)
    host = data["hosts"][0]
    big = max(data["models"], key=lambda m: m["memory_mb"])
    crowd = [{"model_id": big["model_id"], "host_id": host["host_id"]}] * 2
    assert overcommitted_hosts(data, crowd) == [host["host_id"]]
    heavy = [{"model_id": m["model_id"], "host_id": host["host_id"]} for m in data["models"]]
    placeable = host["capacity_mb"] - host["reserved_mb"]
    expected = [host["host_id"]] if sum(m["memory_mb"] for m in data["models"]) > placeable else []
    assert overcommitted_hosts(data, heavy) == expected


def test_an_overcommit_the_file_brings_is_blamed_on_a_plan_only_when_it_adds_to_it():
    # A host whose reserved memory already exceeds its capacity: a plan that leaves it
    # alone is clean; one that puts a replica there overcommits it.
    data = make_fleet(4, 3, 7, 0.0)
    host = data["hosts"][0]
    host["reserved_mb"] = host["capacity_mb"] + 1024
    host["residencies"] = []
    small = min(data["models"], key=lambda m: m["memory_mb"])
    elsewhere = [{"model_id": small["model_id"], "host_id": data["hosts"][1]["host_id"]}]
    assert host["host_id"] not in overcommitted_hosts(data, elsewhere)
    assert host["host_id"] not in violations(data, elsewhere)["memory"]
    there = [{"model_id": small["model_id"], "host_id": host["host_id"]}]
    assert overcommitted_hosts(data, there) == [host["host_id"]]


def test_a_kept_manual_replica_is_charged_the_memory_it_holds_not_its_catalog_size():
    # A process started outside Grid holds 11 GB of a model the catalog sizes at 15 GB. The
    # planner keeps it at 11 GB (it cannot reload it), so a 20 GB replica beside it fits a
    # 32 GB host; a managed replica of the same size may be reloaded at 15 GB, so it does not.
    data = make_fleet(2, 2, 7, 0.0)
    kept, new = data["models"][0], data["models"][1]
    kept["memory_mb"], new["memory_mb"] = 15 * 1024, 20 * 1024
    host = data["hosts"][0]
    host["capacity_mb"], host["reserved_mb"] = 32 * 1024, 0
    residency = {"model_id": kept["model_id"], "memory_mb": 11 * 1024, "state": "ready"}
    host["residencies"] = [{**residency, "managed": False, "active_requests": 0}]
    plan = [{"model_id": m["model_id"], "host_id": host["host_id"]} for m in (kept, new)]
    assert overcommitted_hosts(data, plan) == []
    host["residencies"][0]["managed"] = True
    assert overcommitted_hosts(data, plan) == [host["host_id"]]


def test_cli_json_has_exactly_the_documented_keys(tmp_path):
    p = tmp_path / "fleet.json"
    p.write_text(json.dumps(make_fleet(8, 4, 3, 0.5)))
    app = build_app(plugins_with(builtins=("grid_bench", "grid_scoring", "grid_victims")))
    result = CliRunner().invoke(app, ["bench", "plan", "--fleet", str(p), "--json", "--runs", "1"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) == KEYS
    inputs = fleet_inputs(load_fleet(p))
    assert out["desired"] == sum(
        max(
            m.min_replicas,
            min(m.max_replicas, inputs.demand[m.model_id].desired_replicas),
            len(m.pins),
        )
        for m in inputs.profiles
    )
    assert all(set(u) >= {"model_id", "code", "resource", "missing"} for u in out["unmet"])


def test_cli_reports_a_missing_file_in_one_line(tmp_path):
    app = build_app(plugins_with(builtins=("grid_bench",)))
    result = CliRunner().invoke(app, ["bench", "plan", "--fleet", str(tmp_path / "nope.json")])
    assert result.exit_code != 0


def test_violation_check_is_independent_and_catches_each_kind(tmp_path):
    data = make_fleet(6, 4, 11, 0.0)
    slotted = next(h for h in data["hosts"] if h["max_models"] and h["state"] == "accepting")
    small = sorted(data["models"], key=lambda m: m["memory_mb"])
    gguf = [m for m in small if "llama.cpp" in m["runtimes"]]
    crowd = [
        {"model_id": m["model_id"], "host_id": slotted["host_id"]}
        for m in gguf[: slotted["max_models"] + 1]
    ]
    if len(crowd) > slotted["max_models"]:
        assert slotted["host_id"] in violations(data, crowd)["slots"]
    cuda_only = {"model_id": "cuda", "memory_mb": 1024, "runtimes": ["vllm"], "backends": ["cuda"]}
    data["models"].append({**cuda_only, "required_tags": []})
    mac = next(h for h in data["hosts"] if "metal" in h["backends"])
    assert violations(data, [{"model_id": "cuda", "host_id": mac["host_id"]}])["compatibility"] == [
        f"cuda@{mac['host_id']}"
    ]
    paused = dict(data["hosts"][0], state="paused", residencies=[])
    data["hosts"][0] = paused
    bad = [{"model_id": gguf[0]["model_id"], "host_id": paused["host_id"]}]
    assert violations(data, bad)["eligibility"] == [f"{gguf[0]['model_id']}@{paused['host_id']}"]
    assert violations(data, bad * 2)["duplicate"] == [paused["host_id"]]
    assert violations(data, [{"model_id": "nope", "host_id": "x"}])["unknown"] == ["nope@x"]


def test_cli_exact_prints_the_optimum_and_the_gap(tmp_path):
    pytest.importorskip("highspy")
    p = tmp_path / "fleet.json"
    p.write_text(json.dumps(make_fleet(10, 6, 5, 0.0)))
    app = build_app(plugins_with(builtins=("grid_bench", "grid_scoring", "grid_victims")))
    args = ["bench", "plan", "--fleet", str(p), "--json", "--runs", "1", "--exact"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    ex = out["exact"]
    assert ex["optimal"] and ex["status"] == "Optimal"
    # the unordered optimum is an upper bound on any plan, Grid's included
    assert out["placed"] <= ex["unordered"] <= out["desired"]
    assert ex["gap"] == pytest.approx(ex["coverage"] - out["coverage"], abs=1e-3)
    # the per-class losses account for every replica between Grid and the unordered optimum
    assert sum(ex["loss_by_class"].values()) == ex["unordered"] - out["placed"]
    table = CliRunner().invoke(app, ["bench", "plan", "--fleet", str(p), "--runs", "1", "--exact"])
    assert "exact:gap" in table.output


@pytest.mark.parametrize(
    ("hosts", "models", "seed", "occupancy"), [(6, 8, 1, 0.5), (10, 6, 5, 0.0)]
)
def test_cli_exact_text_lists_each_model_grid_places_fewer_replicas_of(
    tmp_path, hosts, models, seed, occupancy
):
    pytest.importorskip("highspy")
    p = tmp_path / "fleet.json"
    p.write_text(json.dumps(make_fleet(hosts, models, seed, occupancy)))
    app = build_app(plugins_with(builtins=("grid_bench", "grid_scoring", "grid_victims")))
    base = ["bench", "plan", "--fleet", str(p), "--runs", "1", "--exact"]
    as_json = CliRunner().invoke(app, [*base, "--json"])
    assert as_json.exit_code == 0, as_json.output
    short = json.loads(as_json.output)["exact"]["short_models"]
    text = CliRunner().invoke(app, base)
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    for model_id, counts in short.items():
        # the text form shows what --json shows: Grid's replicas, the optimum's, the shortfall
        # (the per-model comparison prints before the unmet table, so its row comes first)
        row = next(line for line in lines if line.split() and line.split()[0] == model_id)
        gap = counts["exact"] - counts["grid"]
        assert row.split()[1:] == [str(counts["grid"]), str(counts["exact"]), str(gap)]
    if not short:
        assert "as many replicas as the optimum for every model" in text.output


def test_exact_help_names_the_extra_to_install():
    app = build_app(plugins_with(builtins=("grid_bench",)))
    result = CliRunner().invoke(app, ["bench", "plan", "--help"], env={"COLUMNS": "200"})
    assert "grid[exact]" in result.output


def test_bench_fleet_writes_a_file_that_bench_plan_reads(tmp_path):
    """``grid bench fleet`` makes the input ``grid bench plan`` needs, the same bytes for the
    same arguments; a bad argument is refused with the flag and its range (exit 2)."""
    app = build_app(plugins_with(builtins=("grid_bench",)))
    runner = CliRunner()
    out = tmp_path / "f.json"
    args = ["bench", "fleet", "--hosts", "12", "--models", "6", "--seed", "9", "--occupancy", "0.5"]
    made = runner.invoke(app, [*args, "--out", str(out)])
    assert made.exit_code == 0, made.output
    again = runner.invoke(app, args)  # stdout
    assert again.exit_code == 0 and again.stdout == out.read_text()
    doc = load_fleet(out)
    assert len(doc["hosts"]) == 12 and len(doc["models"]) == 6
    assert any(h["residencies"] for h in doc["hosts"])  # occupancy 0.5 leaves residents
    plan = runner.invoke(app, ["bench", "plan", "--fleet", str(out), "--json", "--runs", "1"])
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["violations"] == 0
    bad = runner.invoke(app, ["bench", "fleet", "--occupancy", "1.5"])
    assert bad.exit_code == 2 and "--occupancy" in str(bad.exception) + bad.output


def test_bench_fleet_and_plan_name_a_wrong_path_as_a_usage_error(tmp_path, capsys):
    """A missing ``--out`` directory, an ``--out`` or ``--fleet`` that is a directory: one
    line naming the path and the fix, exit 2, and nothing written."""
    base = ["bench", "fleet", "--hosts", "4", "--models", "2"]
    with pytest.raises(SystemExit) as missing:
        main([*base, "--out", str(tmp_path / "nope" / "f.json")])
    assert missing.value.code == 2
    err = capsys.readouterr().err
    assert "--out" in err and "does not exist" in err and str(tmp_path / "nope") in err
    with pytest.raises(SystemExit) as folder:
        main([*base, "--out", str(tmp_path)])
    assert folder.value.code == 2 and "is a directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written, no temp file left
    with pytest.raises(SystemExit) as plan_dir:
        main(["bench", "plan", "--fleet", str(tmp_path)])
    assert plan_dir.value.code == 2 and "is a directory" in capsys.readouterr().err


def test_text_table_names_an_unusable_pin_and_where_its_replica_went(tmp_path):
    """A pin to a host that is not in the fleet is reported with that host, and its replica,
    placed on another host, is not counted missing."""
    doc = make_fleet(8, 4, 3, 0.0)
    doc["models"][0].update(pinned_hosts=["host-999"], min_replicas=1, priority=3)
    p = tmp_path / "fleet.json"
    p.write_text(json.dumps(doc))
    app = build_app(plugins_with(builtins=("grid_bench",)))
    result = CliRunner().invoke(app, ["bench", "plan", "--fleet", str(p), "--runs", "1"])
    assert result.exit_code == 0, result.output
    row = next(ln for ln in result.output.splitlines() if ln.startswith("model-01"))
    assert "host-999" in row and "0 (placed on another host)" in row, row
