"""Sensor probes run with a bare environment: no node credential, no GRID_HOME."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from grid_node import telemetry


def test_a_sensor_probe_inherits_no_grid_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real executable named loginctl first on PATH, recording the environment it got.
    seen = tmp_path / "env.txt"
    probe = tmp_path / "bin" / "loginctl"
    probe.parent.mkdir()
    probe.write_text(f"#!/bin/sh\nenv > {seen}\n")
    probe.chmod(probe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{probe.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GRID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRID_ALLOCATOR_TOKEN", "node-secret")

    assert telemetry._linux_idle_s() is None  # no sessions listed: idle time unknown
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert not [k for k in env if k.startswith("GRID_")]
    assert "node-secret" not in seen.read_text()
    assert env.get("LC_ALL") == "C"
