"""``grid join --at URL -m MODEL --kind vllm``: an engine Grid does not own serves demand as
vLLM inventory, is never stopped by Grid, and leaves with one command."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from fake_engines import make_vllm_snapshot, vllm_launcher, wait_http

from grid_core.system import wait_until_sync
from grid_server.harness import Testbed, fake_engine_in_thread, start_server

pytestmark = pytest.mark.e2e
WAIT_S = 90.0
PRESSURE_TICKS = 24
PRESSURE_TICK_S = 0.5
"""24 forced ticks half a second apart: over two of the keeper's 5 s refreshes."""


def grid(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_join_routes_to_an_external_engine_and_remove_takes_it_out(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_server(home, tick_interval_s=0.5)
    bed = Testbed(server.url, home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    snap = make_vllm_snapshot(tmp_path / "models" / "ext-qwen")
    key_file = tmp_path / "engine-key"
    key_file.write_text("external-secret\n")
    config = tmp_path / "vllm-config.yaml"
    config.write_text('{"api-key": "external-secret"}')
    port = free_port()
    engine = subprocess.Popen(
        [str(vllm_launcher(tmp_path / "bin")), "serve", str(snap), "--served-model-name",
         "ext-qwen", "--host", "127.0.0.1", "--port", str(port), "--config", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health")
        out = grid(
            env, "join", "--at", url, "-m", "ext-qwen", "--kind", "vllm",
            "--api-key-file", str(key_file), "--name", "lab-vllm", "--grid", server.url,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr + out.stdout
        assert "grid join --remove lab-vllm" in out.stdout
        bed.wait_ready("ext-qwen", timeout_s=WAIT_S)
        hi = [{"role": "user", "content": "hi"}]
        chat = {"model": "ext-qwen", "max_tokens": 4, "messages": hi}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=WAIT_S)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4

        # A vLLM-only profile counts the joined engine as its replica: nothing to place.
        ops = bed.operator()
        profile = {"model_id": "ext-qwen", "memory_mb": 1024, "runtimes": ["vllm"],
                   "min_replicas": 1, "max_replicas": 1}  # fmt: skip
        put = bed.http.put(f"{server.url}/allocator/models/ext-qwen", headers=ops, json=profile)
        assert put.status_code == 200, put.text
        bed.http.put(f"{server.url}/allocator/mode", headers=ops, json={"mode": "automatic"})
        bed.http.post(f"{server.url}/allocator/tick", headers=ops)
        status = bed.http.get(f"{server.url}/allocator/status", headers=ops).text
        assert "external-lab-vllm" in status

        gone = grid(env, "join", "--remove", "lab-vllm")
        assert gone.returncode == 0, gone.stderr
        assert wait_until_sync(
            lambda: "ext-qwen" not in bed.client.models(), timeout_s=WAIT_S, interval_s=0.2
        )
        assert engine.poll() is None and psutil.pid_exists(engine.pid)  # never stopped by Grid
        again = grid(env, "join", "--remove", "lab-vllm")
        assert again.returncode != 0 and "no joined engine named 'lab-vllm'" in again.stderr
    finally:
        grid(env, "join", "--remove", "lab-vllm")
        engine.terminate()
        engine.wait(10)
        bed.close()
        server.stop()


def _actions_on(status: dict, host_id: str) -> list[tuple[str, str]]:
    """(kind, status) of every action the controller ever created or proposed for a host."""
    ctl = status["controller"]
    rec = ctl.get("reconciliation") or {}
    rows = [*ctl.get("pending_commands", []), *ctl.get("history", []),
            *ctl.get("withdrawn_destructive", []), *rec.get("proposals", [])]  # fmt: skip
    return [(a["kind"], a.get("status", "proposed")) for a in rows if a.get("host_id") == host_id]


def test_controller_never_commands_a_joined_engine_under_scale_down_and_retire_pressure(
    tmp_path: Path,
) -> None:
    """No demand, one allowed replica, then the profile retired: a managed twin of the same
    model is drained, while the joined engine gets no command and keeps serving."""
    home = tmp_path / "home"
    server = start_server(home, tick_interval_s=0.5)
    bed = Testbed(server.url, home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    snap = make_vllm_snapshot(tmp_path / "models" / "ext-qwen")
    port = free_port()
    engine = subprocess.Popen(
        [str(vllm_launcher(tmp_path / "bin")), "serve", str(snap), "--served-model-name",
         "ext-qwen", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    twin_engine, twin_key = fake_engine_in_thread("ext-qwen")
    url = f"http://127.0.0.1:{port}"
    ext = "external-lab-vllm"
    try:
        wait_http(f"{url}/health")
        out = grid(env, "join", "--at", url, "-m", "ext-qwen", "--kind", "vllm",
                   "--name", "lab-vllm", "--grid", server.url)  # fmt: skip
        assert out.returncode == 0, out.stderr + out.stdout
        # Its keeper files it within a refresh: the engine is inventory before any pressure.
        assert wait_until_sync(
            lambda: ext in {n["host_id"] for n in bed.client.status()["server"]["nodes"]},
            timeout_s=WAIT_S,
            interval_s=0.5,
        )
        # The managed twin: a Grid-owned replica of the same model on a node Grid commands.
        twin = bed.node_token("managed-twin")
        bed.register_host(twin, "managed-twin", residencies=[
            {"model_id": "ext-qwen", "memory_mb": 1024, "state": "ready", "ownership": "managed"}
        ])  # fmt: skip
        bed.register_engine(twin, "managed-twin", "ext-qwen", twin_engine.url, twin_key)
        ops = bed.operator()
        profile = {"model_id": "ext-qwen", "memory_mb": 1024, "min_replicas": 0,
                   "max_replicas": 1, "min_residency_s": 0.0,
                   "scale_down_cooldown_s": 0.0}  # fmt: skip
        assert bed.http.put(f"{server.url}/allocator/models/ext-qwen", headers=ops,
                            json=profile).status_code == 200  # fmt: skip
        bed.http.put(f"{server.url}/allocator/mode", headers=ops, json={"mode": "automatic"})

        def status() -> dict:
            bed.http.post(f"{server.url}/allocator/tick", headers=ops)
            r = bed.http.get(f"{server.url}/allocator/status", params={"detail": "1"}, headers=ops)
            return dict(r.json())

        # The pressure is real: the controller drains the managed twin it owns...
        drained = wait_until_sync(
            lambda: any(k == "drain" for k, _ in _actions_on(status(), "managed-twin")),
            timeout_s=WAIT_S,
            interval_s=0.5,
        )
        assert drained, _actions_on(status(), "managed-twin")
        # ... and retiring the model adds more; still nothing ever targets the joined engine.
        assert bed.http.delete(f"{server.url}/allocator/models/ext-qwen",
                               headers=ops).status_code in (200, 204)  # fmt: skip
        present = 0
        for _ in range(PRESSURE_TICKS):
            time.sleep(PRESSURE_TICK_S)
            doc = status()
            assert _actions_on(doc, ext) == [], _actions_on(doc, ext)
            present += ext in {h["host_id"] for h in doc["controller"]["hosts"]}
        assert present == PRESSURE_TICKS, f"the joined engine was in {present} of the ticks"

        # Listed as external inventory (a keeper probe that timed out on a loaded machine
        # withdraws the record until the next refresh, so wait for it rather than read once).
        def listed() -> dict | None:
            hosts = {h["host_id"]: h for h in status()["controller"]["hosts"]}
            return hosts.get(ext)

        row = wait_until_sync(listed, timeout_s=WAIT_S, interval_s=0.5)
        assert row is not None
        assert [(r["model_id"], r["ownership"]) for r in row["residencies"]] == [
            ("ext-qwen", "external")
        ]
        assert row["runtimes"] == ["vllm"]
        # It is still routable: the router sends it work like any ready engine.
        assert wait_until_sync(
            lambda: "ext-qwen" in bed.client.models(), timeout_s=WAIT_S, interval_s=0.5
        )
        hi = [{"role": "user", "content": "hi"}]
        for _ in range(3):
            r = httpx.post(f"{server.url}/v1/chat/completions", timeout=WAIT_S,
                           json={"model": "ext-qwen", "max_tokens": 3, "messages": hi})  # fmt: skip
            assert r.status_code == 200, r.text
        assert engine.poll() is None  # Grid never stopped it
        assert _actions_on(status(), ext) == []  # history keeps every action ever created

        def printed() -> bool:
            text = grid(env, "allocator", "status", "--grid", server.url)
            return "ext-qwen:ready(external)" in "".join(text.stdout.split())

        assert wait_until_sync(printed, timeout_s=WAIT_S, interval_s=1.0)
    finally:
        grid(env, "join", "--remove", "lab-vllm")
        engine.terminate()
        engine.wait(10)
        twin_engine.stop()
        bed.close()
        server.stop()
