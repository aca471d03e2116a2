"""Two real node agents under one host id against a real server (loopback): the second is
refused while the first heartbeats, and takes over once the first has stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grid_core.client import GridClient
from grid_core.system import is_gone, wait_until_sync
from grid_node.launch import agent_record, agent_running, stop_node
from grid_server.harness import Child, start_server

pytestmark = pytest.mark.integration

GRID_BIN = Path(sys.executable).parent / "grid"
HOST = "host-05"


class Grid:
    """A server, its home and a node credential for :data:`HOST`."""

    def __init__(self, child: Child, home: Path, token: Path) -> None:
        self.child, self.home, self.token = child, home, token

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
        env["GRID_HOME"] = str(self.home)
        return subprocess.run(
            [str(GRID_BIN), *args], env=env, capture_output=True, text=True, timeout=120
        )

    def node_start(self, state_dir: Path, ports: str) -> subprocess.CompletedProcess[str]:
        return self.cli(
            "allocator", "node", "start", "--grid", self.child.url, "--token-file",
            str(self.token), "--state-dir", str(state_dir), "--port-range", ports,
            "--heartbeat-interval", "0.5", "--dedicated",
        )  # fmt: skip

    def status(self) -> dict[str, object]:
        with GridClient(self.child.url) as client:
            server = client.status()["server"]
        assert isinstance(server, dict)
        return server

    def holder(self) -> object:
        nodes = self.status()["nodes"]
        assert isinstance(nodes, list)
        return next(n["instance"] for n in nodes if n["role"] == "allocator")


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    home = tmp_path / "home"
    child = start_server(home)
    g = Grid(child, home, tmp_path / "token.json")
    started: list[Path] = [tmp_path / "A", tmp_path / "B"]
    try:
        r = g.cli("allocator", "token", "write", str(g.token), "--host-id", HOST)
        assert r.returncode == 0, r.stderr
        yield g
    finally:
        for sdir in started:
            if agent_running(sdir):
                stop_node(sdir)
        child.stop()


def test_a_second_agent_under_a_held_host_id_is_refused_and_the_first_keeps_serving(
    grid: Grid, tmp_path: Path
) -> None:
    a, b = tmp_path / "A", tmp_path / "B"
    first = grid.node_start(a, "22300-22309")
    assert first.returncode == 0, first.stderr
    rec_a = agent_record(a)
    assert rec_a is not None and rec_a.registered
    assert grid.holder() == rec_a.instance[:12]

    second = grid.node_start(b, "22400-22409")
    assert second.returncode != 0
    out = second.stdout + second.stderr
    assert f"host id '{HOST}' is in use by another node agent" in out
    assert "last heard" in out and "frees up in" in out and "grid allocator node stop" in out
    assert "still heartbeating" not in out
    assert not agent_running(b)
    rec_b = agent_record(b)
    assert rec_b is not None and not rec_b.registered
    assert f"host id '{HOST}'" in rec_b.last_error  # `node status --state-dir B` shows it

    refusals = grid.status()["instance_refusals"]
    assert isinstance(refusals, list) and refusals[-1]["host_id"] == HOST
    assert refusals[-1]["holder"] == rec_a.instance[:12]
    assert refusals[-1]["instance"] == rec_b.instance[:12]

    # The first agent still serves: it stays the holder and keeps heartbeating.
    assert agent_running(a)
    since = rec_a.last_ok_at or 0.0

    def beat_after_refusal() -> bool:
        now = agent_record(a)
        return now is not None and (now.last_ok_at or 0.0) > since and not now.last_error

    assert wait_until_sync(beat_after_refusal, timeout_s=30, interval_s=0.2)
    assert grid.holder() == rec_a.instance[:12]


def test_after_the_first_agent_stops_a_second_takes_the_host_id_over(
    grid: Grid, tmp_path: Path
) -> None:
    a, b = tmp_path / "A", tmp_path / "B"
    assert grid.node_start(a, "22300-22309").returncode == 0
    stop_node(a)  # a clean stop deregisters and releases the host id at once
    second = grid.node_start(b, "22400-22409")
    assert second.returncode == 0, second.stdout + second.stderr
    rec_b = agent_record(b)
    assert rec_b is not None and rec_b.registered
    assert grid.holder() == rec_b.instance[:12]


def test_an_agent_restarted_after_a_crash_on_its_state_directory_is_not_locked_out(
    grid: Grid, tmp_path: Path
) -> None:
    a = tmp_path / "A"
    assert grid.node_start(a, "22300-22309").returncode == 0
    crashed = agent_record(a)
    assert crashed is not None and crashed.pid is not None
    os.kill(crashed.pid, signal.SIGKILL)  # no clean stop: the host id stays held
    assert wait_until_sync(lambda: is_gone(crashed.pid), timeout_s=30, interval_s=0.1)
    again = grid.node_start(a, "22300-22309")
    assert again.returncode == 0, again.stdout + again.stderr
    rec = agent_record(a)
    assert rec is not None and rec.instance != crashed.instance
    assert grid.holder() == rec.instance[:12]
