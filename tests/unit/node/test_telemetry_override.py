"""Telemetry reports unknown sensors as None; local overrides are durable and expire."""

from __future__ import annotations

import os
import stat
import time

import psutil
import pytest
from typer.testing import CliRunner

from grid_core.cli import build_app, main
from grid_core.protection import ProtectionPolicy, ProtectionState, step
from grid_core.testing import plugins_with
from grid_node import telemetry
from grid_node.override import read_override
from grid_node.state import StateFile


def test_missing_sensors_are_unknown_not_zero(monkeypatch):
    monkeypatch.setattr(psutil, "sensors_battery", lambda: None)
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: {})
    s = telemetry.sample(at=1.0)
    assert s.battery_pct is None and s.charging is None
    assert s.temperature_c is None
    assert s.user_idle_s is None
    assert s.memory_pct is not None and 0 < s.memory_pct <= 100


def test_resources_scale_with_capacity_share_and_exclude_managed_memory(tmp_path):
    whole = telemetry.resources(
        capacity_share=1.0,
        managed_pids=[],
        artifact_dir=tmp_path,
        runtimes=["llama.cpp"],
        throttle_fraction=1.0,
    )
    quarter = telemetry.resources(
        capacity_share=0.25,
        managed_pids=[],
        artifact_dir=tmp_path,
        runtimes=["llama.cpp"],
        throttle_fraction=0.5,
    )
    assert abs(quarter.capacity_mb - whole.capacity_mb / 4) <= 1
    assert quarter.throttle_fraction == 0.5
    mine = telemetry.resources(
        capacity_share=1.0,
        managed_pids=[os.getpid()],
        artifact_dir=tmp_path,
        runtimes=[],
        throttle_fraction=1.0,
    )
    # This process's memory counts as managed, so external use is smaller by about its RSS.
    assert mine.external_used_mb <= whole.external_used_mb + 64


@pytest.mark.parametrize("total_mb", [8_192, 16_000, 24_002, 24_105.2578125, 65_536, 131_072])
@pytest.mark.parametrize("capacity_mb", [1_024, 3_072, 7_189])
def test_a_logical_host_reports_the_capacity_its_fleet_gave_it(
    tmp_path, monkeypatch, total_mb, capacity_mb
):
    """The fleet stores a host's share of RAM to 6 decimals; the node must report back the
    MB it was given, not one less (3,071 for 3,072 on a 24,105 MB machine)."""
    from grid_fleet.layout import host_specs

    real = psutil.virtual_memory()
    fake = real._replace(total=int(total_mb * telemetry.MB))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: fake)
    [host] = host_specs((capacity_mb,), 30_000)
    got = telemetry.resources(
        capacity_share=host.capacity_share,
        managed_pids=[],
        artifact_dir=tmp_path,
        runtimes=["llama.cpp"],
        throttle_fraction=1.0,
    )
    assert got.capacity_mb == capacity_mb


@pytest.fixture
def runner_app(tmp_path, monkeypatch):
    monkeypatch.setenv("GRID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRID_NODE_STATE_DIR", str(tmp_path / "node"))
    app = build_app(plugins_with(builtins=("grid_node",)))
    StateFile(tmp_path / "node").load_or_create("host-override")  # a node was started here
    return CliRunner(), app, tmp_path / "node"


def test_override_commands_are_durable_owner_only_and_expire(runner_app):
    runner, app, sdir = runner_app
    r = runner.invoke(
        app, ["allocator", "node", "pause", "--reason", "battery use", "--for-seconds", "3600"]
    )
    assert r.exit_code == 0, r.output
    o = read_override(sdir)
    assert o is not None and o.kind == "pause" and o.reason == "battery use"
    assert o.expires_at is not None and o.expires_at > time.time() + 3000
    assert stat.S_IMODE(os.stat(sdir / "override.json").st_mode) == 0o600
    _, decision = step(
        ProtectionState(),
        telemetry.sample(at=0.0),
        ProtectionPolicy(dedicated=True),
        override=o,
        wall_now=time.time(),
        active_requests=0,
    )
    assert decision.state == "paused"
    _, later = step(
        ProtectionState(),
        telemetry.sample(at=0.0),
        ProtectionPolicy(dedicated=True),
        override=o,
        wall_now=o.expires_at + 1,
        active_requests=0,
    )
    assert later.override is None
    r = runner.invoke(app, ["allocator", "node", "quarantine", "--reason", "thermal fault"])
    assert r.exit_code == 0 and read_override(sdir).kind == "quarantine"
    r = runner.invoke(app, ["allocator", "node", "resume"])
    assert r.exit_code == 0 and read_override(sdir) is None


def test_override_needs_a_reason(runner_app):
    runner, app, sdir = runner_app
    r = runner.invoke(app, ["allocator", "node", "drain", "--reason", "  "])
    assert r.exit_code != 0
    assert read_override(sdir) is None


@pytest.mark.parametrize("seconds", ["nan", "inf", "-inf", "0", "-5"])
def test_override_duration_must_be_a_finite_positive_number(runner_app, capsys, seconds):
    """``--for-seconds nan`` once set an override that never lapsed while saying "for nan s"."""
    _, _, sdir = runner_app
    with pytest.raises(SystemExit) as exc:
        main(["allocator", "node", "drain", "--reason", "maint", "--for-seconds", seconds])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("grid: error: --for-seconds")
    assert read_override(sdir) is None


@pytest.mark.parametrize("kind", ["drain", "pause", "quarantine", "resume"])
def test_override_commands_refuse_a_state_dir_without_a_node(tmp_path, monkeypatch, capsys, kind):
    """A mistyped --state-dir was told 'local drain set' and got a fresh override.json that
    no node agent would ever read; now the command names the path and writes nothing."""
    monkeypatch.setenv("GRID_HOME", str(tmp_path / "home"))
    typo = tmp_path / "nodee"
    args = [] if kind == "resume" else ["--reason", "maint"]
    with pytest.raises(SystemExit) as exc:
        main(["allocator", "node", kind, *args, "--state-dir", str(typo)])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"grid: error: no node agent in --state-dir {typo}")
    assert "grid allocator node start" in err
    assert not typo.exists()
    # An existing directory that holds no node state is refused the same way.
    typo.mkdir()
    with pytest.raises(SystemExit):
        main(["allocator", "node", kind, *args, "--state-dir", str(typo)])
    assert list(typo.iterdir()) == []


def test_resume_clears_an_override_left_without_node_state(runner_app):
    runner, app, sdir = runner_app
    assert runner.invoke(app, ["allocator", "node", "drain", "--reason", "maint"]).exit_code == 0
    (sdir / "node.json").unlink()  # the node's state is gone; its override is not
    r = runner.invoke(app, ["allocator", "node", "resume"])
    assert r.exit_code == 0, r.output
    assert read_override(sdir) is None
