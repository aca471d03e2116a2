"""GPU facts from NVML reach placement: two real node agents, one with a (FAKE) NVIDIA GPU.

Both agents load the built-in ``grid_gpu`` plugin, which reads NVML through ``pynvml``; the
fake binding (``tests/fakes/nvml``) stands first on their ``PYTHONPATH``. Node A's fake NVML
reports one 24 GB GPU; node B's reports no driver (absent GPU = no GPU, not an error). A
profile with ``min_gpu_count 1`` must be placed on A and only on A.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_engines import FAKES
from grid_llamacpp.tinymodel import TinyModelSpec, make_model
from ports import port_range

from grid_core.system import wait_until_sync
from grid_server.harness import Testbed, start_server

pytestmark = pytest.mark.e2e

WAIT_S = 120.0
"""Upper bound for convergence on a busy 2-core machine (never asserted as a time)."""
PORT_RANGES = {
    "gpu": "{}-{}".format(*port_range(22820, 22829)),
    "cpu": "{}-{}".format(*port_range(22830, 22839)),
}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_min_gpu_count_places_only_on_the_node_whose_nvml_reports_a_gpu(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_server(home, tick_interval_s=0.5)
    grid = Testbed(server.url, home)
    models = tmp_path / "models"
    make_model(models / "tiny.gguf", TinyModelSpec(name="tiny", seed=4))
    devices = tmp_path / "nvml-devices.json"
    devices.write_text(
        json.dumps([{"name": "NVIDIA FAKE-24GB", "memory_total_mb": 24576, "memory_used_mb": 512}])
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GRID_", "FAKE_NVML"))}
    base["GRID_HOME"] = str(home)
    base["PYTHONPATH"] = os.pathsep.join([str(FAKES / "nvml"), base.get("PYTHONPATH", "")])
    envs = {"gpu": {**base, "FAKE_NVML_DEVICES": str(devices)}, "cpu": base}
    states = {name: tmp_path / f"node-{name}" for name in envs}
    try:
        for name, env in envs.items():
            host = f"host-{name}-{os.getpid()}"
            token_file = tmp_path / f"{name}-token"
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, json.dumps({"host_id": host, "token": grid.node_token(host)}).encode())
            os.close(fd)
            out = cli(
                env, "allocator", "node", "start", "--grid", server.url,
                "--token-file", str(token_file), "--state-dir", str(states[name]),
                "--port-range", PORT_RANGES[name], "--models-dir", str(models),
                "--heartbeat-interval", "0.5",
            )  # fmt: skip
            assert out.returncode == 0, out.stderr + out.stdout

        def hosts() -> dict[str, dict]:
            nodes = grid.http.get(f"{server.url}/nodes").json()["nodes"]
            return {n["host_id"]: n for n in nodes if n.get("role") == "allocator"}

        assert wait_until_sync(lambda: len(hosts()) == 2, timeout_s=WAIT_S, interval_s=0.2)
        gpu_host, cpu_host = (f"host-{n}-{os.getpid()}" for n in ("gpu", "cpu"))

        ops = grid.operator()
        profile = {
            "model_id": "tiny.gguf",
            "memory_mb": 64,
            "min_replicas": 2,
            "max_replicas": 2,
            "min_gpu_count": 1,
        }
        r = grid.http.put(f"{server.url}/allocator/models/tiny.gguf", headers=ops, json=profile)
        assert r.status_code == 200, r.text
        r = grid.http.put(f"{server.url}/allocator/mode", headers=ops, json={"mode": "automatic"})
        assert r.status_code == 200, r.text
        grid.wait_ready("tiny.gguf", timeout_s=WAIT_S)

        def resident_on() -> set[str]:
            on = set()
            for name, state_dir in states.items():
                doc = json.loads((state_dir / "node.json").read_text())
                if "tiny.gguf" in doc.get("children", {}):
                    on.add(name)
            return on

        def status_text() -> str:
            return json.dumps(grid.http.get(f"{server.url}/allocator/status", headers=ops).json())

        # Two replicas wanted, one GPU node: the plan refuses the CPU node for its GPU count
        # (a shortfall, visible in status) and the one replica runs on the GPU node.
        assert wait_until_sync(lambda: "gpu_count" in status_text(), timeout_s=WAIT_S)
        assert resident_on() == {"gpu"}
        text = status_text()
        assert gpu_host in text and cpu_host in text
    finally:
        for name, env in envs.items():
            cli(env, "allocator", "node", "stop", "--state-dir", str(states[name]))
        grid.close()
        server.stop()
