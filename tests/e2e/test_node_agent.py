"""The detached node agent against the real Grid server, with real llama-server children.

Covers: node start (readiness lease, token file), automatic load+warm through heartbeats,
serving through the server's proxy, a local drain override reaching the server, node stop
(graceful, children gone, records removed) and the refusal to signal an unprovable daemon.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from grid_llamacpp.tinymodel import TinyModelSpec, make_model
from ports import port_range

from grid_core.system import is_gone, wait_until, wait_until_sync
from grid_server.harness import Testbed, start_server

pytestmark = pytest.mark.e2e

PORTS = "{}-{}".format(*port_range(22600, 22649))
"""Managed ports for this test's agent (apart from other e2e tests)."""
WAIT_S = 90.0
"""Upper bound for convergence steps on a busy 2-core machine (never asserted as a time)."""


def wait_for(predicate, what: str):
    value = wait_until_sync(predicate, timeout_s=WAIT_S, interval_s=0.2)
    if not value:
        raise AssertionError(f"timed out waiting for {what}")
    return value


@pytest.fixture
def fleet(tmp_path: Path):
    home = tmp_path / "home"
    server = start_server(home, tick_interval_s=0.5)
    client = Testbed(server.url, home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    state_dir = tmp_path / "node"
    try:
        yield server, client, env, state_dir
    finally:
        # Graceful stop if the agent still runs; it stops only proven children.
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from grid_core.cli import main; main()",
                "allocator",
                "node",
                "stop",
                "--state-dir",
                str(state_dir),
            ],
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
        client.close()
        server.stop()


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_node_agent_converges_serves_drains_and_stops(fleet, tmp_path):
    server, client, env, state_dir = fleet
    models = tmp_path / "models"
    make_model(models / "tiny.gguf", TinyModelSpec(name="tiny", seed=3))
    token_file = tmp_path / "node-token"
    token = client.node_token("host-e2e-agent")
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps({"host_id": "host-e2e-agent", "token": token}).encode())
    os.close(fd)

    start_args = (
        "allocator",
        "node",
        "start",
        "--grid",
        server.url,
        "--token-file",
        str(token_file),
        "--state-dir",
        str(state_dir),
        "--port-range",
        PORTS,
        "--models-dir",
        str(models),
        "--heartbeat-interval",
        "0.5",
    )
    started = cli(env, *start_args)
    assert started.returncode == 0, started.stderr + started.stdout
    assert "host-e2e-agent" in started.stdout
    agent = json.loads((state_dir / "agent.json").read_text())
    daemon = psutil.Process(agent["pid"])
    assert token not in " ".join(daemon.cmdline())  # the credential is never in argv

    ops = client.operator()
    r = client.http.put(
        f"{server.url}/allocator/models/tiny.gguf",
        headers=ops,
        json={"model_id": "tiny.gguf", "memory_mb": 64, "min_replicas": 1, "max_replicas": 1},
    )
    assert r.status_code == 200, r.text
    r = client.http.put(f"{server.url}/allocator/mode", headers=ops, json={"mode": "automatic"})
    assert r.status_code == 200, r.text
    client.wait_ready("tiny.gguf", timeout_s=WAIT_S)

    chat = client.http.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": "tiny.gguf",
            "max_tokens": 6,
            "messages": [{"role": "user", "content": "Reply with OK"}],
        },
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] > 0

    state = json.loads((state_dir / "node.json").read_text())
    child = state["children"]["tiny.gguf"]
    assert child["state"] == "ready" and psutil.pid_exists(child["pid"])
    acks = {r["kind"]: r["ack"] for r in state["receipts"]}
    assert acks["load"]["status"] == "succeeded" and acks["load"].get("artifact_fetched") in (
        None,
        False,
    )  # a local file was verified, nothing transferred
    assert acks["warm"]["status"] == "succeeded" and acks["warm"]["duration_seconds"] > 0
    assert state["highest_term"] >= 1

    # The agent dies hard; its child keeps serving; a new agent adopts that exact child.
    os.kill(daemon.pid, signal.SIGKILL)
    wait_for(
        lambda: not daemon.is_running() or daemon.status() == psutil.STATUS_ZOMBIE,
        "the killed agent to exit",
    )
    assert psutil.Process(child["pid"]).is_running()
    again = cli(env, *start_args)
    assert again.returncode == 0, again.stderr + again.stdout
    agent = json.loads((state_dir / "agent.json").read_text())
    assert agent["pid"] != daemon.pid
    daemon = psutil.Process(agent["pid"])
    state = json.loads((state_dir / "node.json").read_text())
    assert state["children"]["tiny.gguf"]["pid"] == child["pid"]
    assert state["children"]["tiny.gguf"]["state"] == "ready"
    assert any("adopted tiny.gguf" in e for e in agent["events"])
    client.wait_ready("tiny.gguf", timeout_s=WAIT_S)
    chat = client.http.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": "tiny.gguf",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert chat.status_code == 200, chat.text

    # A local override reaches the server as the host's lifecycle state.
    out = cli(
        env,
        "allocator",
        "node",
        "drain",
        "--reason",
        "taking laptop home",
        "--state-dir",
        str(state_dir),
    )
    assert out.returncode == 0, out.stderr

    def host_state() -> str | None:
        nodes = client.http.get(f"{server.url}/nodes").json()["nodes"]
        ctl = [n for n in nodes if n["node_id"] == "ctl.host-e2e-agent"]
        return ctl[0].get("state") if ctl else None

    wait_for(lambda: host_state() == "draining", "host state draining on the server")
    assert cli(env, "allocator", "node", "resume", "--state-dir", str(state_dir)).returncode == 0
    # Back to admitting work (a busy shared CI machine may legitimately report throttled).
    wait_for(lambda: host_state() in ("accepting", "throttled"), "host admitting again")

    stopped = cli(env, "allocator", "node", "stop", "--state-dir", str(state_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert not daemon.is_running() or daemon.status() == psutil.STATUS_ZOMBIE
    assert is_gone(child["pid"])
    nodes = client.http.get(f"{server.url}/nodes").json()["nodes"]
    assert not [n for n in nodes if n["host_id"] == "host-e2e-agent"]


def test_node_stop_refuses_an_unprovable_daemon_pid(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(tmp_path / "home")
    state_dir = tmp_path / "node"
    state_dir.mkdir()
    other = subprocess.Popen(["sleep", "60"])
    try:
        # The agent record names a live pid that is not a node agent (reused pid).
        (state_dir / "agent.json").write_text(
            json.dumps(
                {
                    "pid": other.pid,
                    "birth": psutil.Process(other.pid).create_time(),
                    "instance": "0123456789abcdef",
                }
            )
        )
        out = cli(env, "allocator", "node", "stop", "--state-dir", str(state_dir))
        assert out.returncode != 0
        assert "refusing to signal" in out.stderr
        assert other.poll() is None  # still alive: never signalled
    finally:
        other.kill()
        other.wait()


@pytest.mark.anyio
async def test_lease_and_fence_heartbeats_never_consume_commands(tmp_path):
    from grid_core.nodeconfig import NodeConfig
    from grid_core.testing import plugins_with
    from grid_node.agent import NodeAgent

    home = tmp_path / "home"
    server = start_server(home, tick_interval_s=0.3)
    client = Testbed(server.url, home)
    models = tmp_path / "models"
    make_model(models / "tiny.gguf", TinyModelSpec(name="tiny", seed=4))
    token_file = tmp_path / "token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(
        fd, json.dumps({"host_id": "host-lease", "token": client.node_token("host-lease")}).encode()
    )
    os.close(fd)
    agent = NodeAgent(
        NodeConfig(
            state_dir=tmp_path / "node",
            grid_url=server.url,
            token_file=token_file,
            model_dirs=(models,),
            port_range=port_range(22650, 22659),
        ),
        plugins_with(builtins=("grid_llamacpp",)),
    )
    try:
        await agent.open()
        agent.protect()
        await agent._register(agent.sessions[0])
        ops = client.operator()
        client.http.put(
            f"{server.url}/allocator/models/tiny.gguf",
            headers=ops,
            json={"model_id": "tiny.gguf", "memory_mb": 64, "min_replicas": 1},
        ).raise_for_status()
        client.http.put(
            f"{server.url}/allocator/mode", headers=ops, json={"mode": "automatic"}
        ).raise_for_status()

        def pending() -> list[dict]:
            doc = client.http.get(f"{server.url}/allocator/status?detail=1", headers=ops).json()
            ctl = doc.get("controller", doc)
            return [a for a in ctl.get("pending_commands", []) if a["host_id"] == "host-lease"]

        for _ in range(15):  # several controller ticks happen meanwhile
            await agent._heartbeat(agent.sessions[0], request_commands=False)
            await asyncio.sleep(0.2)  # a fixed count of beats, not a deadline
        assert agent._queue.empty()
        waiting = pending()
        assert waiting and all(a.get("delivered_at") is None for a in waiting)

        async def delivered() -> bool:
            await agent._heartbeat(agent.sessions[0], request_commands=True)
            return not agent._queue.empty()

        await wait_until(delivered, timeout_s=WAIT_S, interval_s=0.2)
        cmd, deadline = agent._queue.get_nowait()
        assert cmd.kind == "load" and cmd.model_id == "tiny.gguf" and cmd.executable
        assert deadline > time.monotonic()  # authority measured on the node's own clock
    finally:
        await agent.close()
        client.close()
        server.stop()
