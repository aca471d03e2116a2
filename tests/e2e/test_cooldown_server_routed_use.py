"""Cooldown sees server-routed use, also across a node restart.

The server tells each node when it last routed work to each of its models; the node persists
that watermark (monotonic) and reports it back on every residency row. A real server, a real
detached node agent and a real llama-server child: after a request routed by the server and a
``kill -9`` + restart of the agent, the controller's view of the replica still carries the
server-routed use, so scale-down cooldown is measured from it and not from the load time.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from fleet_cli import cli, wait_for, write_node_token
from grid_llamacpp.tinymodel import TinyModelSpec, make_model
from ports import port_range

from grid_core.client import Calls
from grid_server.harness import Testbed, start_server

pytestmark = pytest.mark.e2e

PORTS = "{}-{}".format(*port_range(22840, 22849))
"""Managed ports for this test's agent (its block in the table of docs/testing.md)."""
HOST = "host-e2e-cooldown"
MODEL = "tiny-cool.gguf"


def _residency(client: Testbed) -> dict[str, object] | None:
    status = client.client.status(detail=True)["controller"]
    for h in status.get("hosts", []):
        if h["host_id"] == HOST:
            for r in h.get("residencies", []):
                if r["model_id"] == MODEL:
                    return r
    return None


def test_cooldown_honours_server_routed_use_across_a_node_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_server(home, tick_interval_s=0.5)
    client = Testbed(server.url, home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    state_dir = tmp_path / "node"
    try:
        models = tmp_path / "models"
        make_model(models / MODEL, TinyModelSpec(name="tiny-cool", seed=5))
        token_file = write_node_token(tmp_path / "node-token", HOST, client.node_token(HOST))
        start_args = (
            *("allocator", "node", "start", "--grid", server.url, "--token-file", str(token_file)),
            *("--state-dir", str(state_dir), "--port-range", PORTS, "--models-dir", str(models)),
            *("--heartbeat-interval", "0.5"),
        )
        started = cli(env, *start_args)
        assert started.returncode == 0, started.stderr + started.stdout
        ops = client.operator()
        profile = {
            "memory_mb": 64,
            "min_replicas": 1,
            "min_residency_s": 0.0,
            "scale_down_cooldown_s": 3600.0,
        }
        r = client.http.put(f"{server.url}/allocator/models/{MODEL}", headers=ops, json=profile)
        assert r.status_code == 200, r.text
        r = client.http.put(f"{server.url}/allocator/mode", headers=ops, json={"mode": "automatic"})
        assert r.status_code == 200, r.text
        client.wait_ready(MODEL, timeout_s=240.0)
        # The router sees the engine before the controller's next pass shows the residency.
        loaded = wait_for(lambda: _residency(client), "the residency in controller status")
        assert loaded is not None and loaded.get("last_used_at") is None  # never used yet

        routed_at = time.time()
        chat = client.http.post(
            f"{server.url}/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 200, chat.text

        def node_watermark() -> float | None:
            state = json.loads((state_dir / "node.json").read_text())
            at = state.get("model_last_used_at", {}).get(MODEL)
            return at if at is not None and at >= routed_at - 1.0 else None

        watermark = wait_for(node_watermark, "the node to persist the server's watermark")

        # kill -9 the agent; a new agent adopts the child and reports the same watermark.
        agent = json.loads((state_dir / "agent.json").read_text())
        daemon = psutil.Process(agent["pid"])
        os.kill(daemon.pid, signal.SIGKILL)
        wait_for(
            lambda: not daemon.is_running() or daemon.status() == psutil.STATUS_ZOMBIE,
            "the killed agent to exit",
        )
        again = cli(env, *start_args)
        assert again.returncode == 0, again.stderr + again.stdout
        assert json.loads((state_dir / "agent.json").read_text())["pid"] != daemon.pid

        def reported() -> dict[str, object] | None:
            res = _residency(client)
            used = res.get("last_used_at") if res is not None else None
            return res if isinstance(used, float | int) and used >= watermark - 0.01 else None

        res = wait_for(reported, "the restarted node to report the server-routed use")
        assert float(res["last_used_at"]) <= time.time()  # type: ignore[arg-type]  # a number
        assert float(res["last_used_at"]) > float(res["loaded_at"])  # type: ignore[arg-type]  # numbers
        # With the baseline lifted, cooldown (measured from that use) keeps the replica.
        r = client.http.put(
            f"{server.url}/allocator/models/{MODEL}",
            headers=ops,
            json={**profile, "min_replicas": 0},
        )
        assert r.status_code == 200, r.text
        client.client.send(Calls.tick())
        fc = client.client.status(detail=True)["controller"]["forecasts"][MODEL]
        assert fc["desired_replicas"] == 1, fc
        assert MODEL in client.client.models()
    finally:
        cli(env, "allocator", "node", "stop", "--state-dir", str(state_dir))
        client.close()
        server.stop()
