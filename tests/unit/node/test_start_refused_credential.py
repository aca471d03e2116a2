"""A node start whose credential the server refuses says so at once, instead of waiting out
the registration budget: a revoked (or expired, or foreign) credential will not be accepted
by waiting, only by provisioning the host again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from grid_core.errors import UnavailableError
from grid_node import launch

REFUSAL = (
    "AuthError: PUT /nodes/ctl.host-03: the server refused the node credential (node "
    "credential for host 'host-03' was revoked; provision the host again with 'grid "
    "allocator join write' or 'grid allocator token write')"
)


def test_a_refused_credential_ends_the_wait_with_the_servers_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = launch.AgentRecord(instance="run-1", pid=proc.pid, last_error=REFUSAL)
        (tmp_path / launch.AGENT_FILE).write_bytes(msgspec.json.encode(record))

        def one_look(predicate, timeout_s: float, interval_s: float):
            return predicate()  # the agent's record as the first poll reads it

        monkeypatch.setattr(launch, "wait_until_sync", one_look)
        with pytest.raises(UnavailableError) as exc:
            launch._wait_registered(tmp_path, "run-1", proc.pid, tmp_path / "agent.log", 60.0)
    finally:
        proc.kill()
        proc.wait()
    text = str(exc.value)
    assert "has not registered within" not in text, text
    assert f"node agent pid {proc.pid} is running but the server refused its credential" in text
    assert "was revoked; provision the host again" in text, text


def test_another_error_is_waited_out_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An unreachable server may come up: the wait goes on (here: one look, then the budget).
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = launch.AgentRecord(
            instance="run-1", pid=proc.pid, last_error="ServerUnreachable: connection refused"
        )
        (tmp_path / launch.AGENT_FILE).write_bytes(msgspec.json.encode(record))
        monkeypatch.setattr(launch, "wait_until_sync", lambda p, timeout_s, interval_s: p())
        with pytest.raises(UnavailableError, match="has not registered within 60 s"):
            launch._wait_registered(tmp_path, "run-1", proc.pid, tmp_path / "agent.log", 60.0)
    finally:
        proc.kill()
        proc.wait()
