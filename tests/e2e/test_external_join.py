"""``grid join --at URL -m MODEL --kind vllm``: an engine Grid does not own serves demand as
vLLM inventory, is never stopped by Grid, and leaves with one command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from fake_engines import make_vllm_snapshot, vllm_launcher, wait_http

from grid_core.system import wait_until_sync
from grid_server.harness import Testbed, start_server

pytestmark = pytest.mark.e2e
WAIT_S = 90.0


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
