"""Operator addressing: named grids (``grid grids …``, ``--grid NAME``) against a real HTTPS
server, and ``grid down`` stopping this machine's managed node before the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from grid_server.harness import start_server

pytestmark = pytest.mark.integration

GRID_BIN = Path(sys.executable).parent / "grid"


def grid_cli(*args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    return subprocess.run(
        [str(GRID_BIN), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_named_grid_carries_url_ca_and_token_file(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert grid_cli("tls", "init", str(pki), home=tmp_path / "cli").returncode == 0
    server_home = tmp_path / "server"
    child = start_server(
        server_home,
        extra_args=[
            "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server-key.pem"),
        ],
    )  # fmt: skip
    op = tmp_path / "operator"  # another GRID_HOME: the operator's own machine
    try:
        token = server_home / "operator-token"
        r = grid_cli(
            "grids", "add", "lab", child.url, "--ca", str(pki / "ca.pem"),
            "--token-file", str(token), home=op,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert (op / "grids.json").stat().st_mode & 0o777 == 0o600
        assert token.read_text().strip() not in (op / "grids.json").read_text()
        mode = grid_cli("allocator", "mode", "observe", "--grid", "lab", home=op)
        assert mode.returncode == 0, mode.stderr
        listed = json.loads(grid_cli("grids", "list", "--json", home=op).stdout)
        assert listed["default"] == "lab" and listed["grids"]["lab"]["url"] == child.url
        # The default grid needs no --grid.
        status = grid_cli("allocator", "status", "--json", home=op)
        assert status.returncode == 0 and json.loads(status.stdout)["mode"] == "observe"
        # 'use local' returns to this machine's server (none runs in the operator's home).
        assert grid_cli("grids", "use", "local", home=op).returncode == 0
        assert grid_cli("allocator", "status", home=op, timeout=60).returncode == 1
        assert grid_cli("grids", "remove", "lab", home=op).returncode == 0
        gone = grid_cli("allocator", "status", "--grid", "lab", home=op)
        assert gone.returncode == 2
        assert gone.stderr.strip().splitlines() == [
            "grid: error: --grid 'lab': no such grid (configured: none yet); give a URL, "
            "'local', or add it with 'grid grids add NAME URL'"
        ]
        bad = grid_cli("grids", "add", "office", "http://198.18.0.5:22100", home=op)
        assert bad.returncode == 2 and "plain HTTP off loopback" in bad.stderr
    finally:
        child.stop()


def test_grid_down_stops_the_managed_node_before_the_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    up = grid_cli("up", "--port", "0", "--detach", home=home)
    assert up.returncode == 0, up.stderr
    server = json.loads((home / "server.json").read_text())
    node_state = home / "node"
    try:
        start = grid_cli(
            "allocator", "node", "start", "--heartbeat-interval", "0.5",
            "--models-dir", str(tmp_path), home=home,
        )  # fmt: skip
        assert start.returncode == 0, start.stderr
        agent = json.loads((node_state / "agent.json").read_text())
        down = grid_cli("down", home=home)
        assert down.returncode == 0, down.stderr
        lines = down.stdout.splitlines()
        node_line = next(i for i, x in enumerate(lines) if "stopping the managed node" in x)
        server_line = next(i for i, x in enumerate(lines) if "stopped the server" in x)
        assert node_line < server_line
        assert not psutil.pid_exists(agent["pid"]) or psutil.Process(agent["pid"]).status() == (
            psutil.STATUS_ZOMBIE
        )
        assert not (home / "server.json").exists()
    finally:
        grid_cli("allocator", "node", "stop", "--force", home=home)
        if (home / "server.json").exists():
            grid_cli("down", home=home)
        assert not psutil.pid_exists(server["pid"]) or (
            psutil.Process(server["pid"]).status() == psutil.STATUS_ZOMBIE
        )
