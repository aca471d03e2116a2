"""``grid allocator status`` (and ``--json``) shows what each node offers: its runtimes, its
compute backends and GPUs, and which residencies are engines Grid does not own."""

from __future__ import annotations

import pytest
from server_testbed import Grid

from grid_core.wire import CONTROL_HEADER, control_record_id
from grid_server.cli_allocator import render_status

pytestmark = pytest.mark.integration


def _put(grid: Grid, host_id: str, resources: dict, allocator: dict) -> None:
    body = {"role": "allocator", "host_id": host_id, "resources": resources,
            "allocator": {"schema_version": 1, "state": "accepting", **allocator}}  # fmt: skip
    grid.http.put(
        f"{grid.url}/nodes/{control_record_id(host_id)}",
        json=body,
        headers={CONTROL_HEADER: grid.node_token(host_id)},
    ).raise_for_status()


def test_status_lists_each_hosts_runtimes_backends_gpus_and_external_engines(grid: Grid) -> None:
    managed = ["load", "warm", "drain", "unload"]
    gpu = {"index": 0, "name": "NVIDIA L4", "memory_total_mb": 23034, "memory_used_mb": 410}
    _put(grid, "gpu-box",
         {"capacity_mb": 65536, "runtimes": ["vllm", "comfyui", "llama.cpp"],
          "backends": ["cuda", "cpu"], "gpus": [gpu, {**gpu, "index": 1}]},
         {"residencies": [], "actuator_capabilities": managed})  # fmt: skip
    _put(grid, "laptop", {"capacity_mb": 16384, "runtimes": ["llama.cpp"], "backends": ["cpu"]},
         {"residencies": [], "actuator_capabilities": managed})  # fmt: skip
    # A joined engine's record, as `grid join --kind ollama` files it: no actuator at all.
    external = {"model_id": "llama3:8b", "memory_mb": 0, "state": "ready",
                "ownership": "external"}  # fmt: skip
    _put(grid, "external-lab-ollama", {"capacity_mb": 0, "runtimes": ["ollama"]},
         {"residencies": [external], "actuator_capabilities": []})  # fmt: skip
    grid.http.post(f"{grid.url}/allocator/tick", headers=grid.operator()).raise_for_status()

    doc = grid.http.get(
        f"{grid.url}/allocator/status", params={"detail": "1"}, headers=grid.operator()
    ).json()
    hosts = {h["host_id"]: h for h in doc["controller"]["hosts"]}
    assert hosts["gpu-box"]["runtimes"] == ["comfyui", "llama.cpp", "vllm"]
    assert hosts["gpu-box"]["backends"] == ["cpu", "cuda"]
    assert (hosts["gpu-box"]["gpu_count"], hosts["gpu-box"]["gpu_memory_mb"]) == (2, 23034)
    assert (hosts["laptop"]["runtimes"], hosts["laptop"]["backends"]) == (["llama.cpp"], ["cpu"])
    assert hosts["laptop"]["gpu_count"] == 0
    ext = hosts["external-lab-ollama"]
    assert ext["runtimes"] == ["ollama"]
    assert [(r["model_id"], r.get("ownership")) for r in ext["residencies"]] == [
        ("llama3:8b", "external")
    ]

    text = render_status(doc)
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert "comfyui,llama.cpp,vllm / cpu,cuda (2 GPU, 23034 MB)" in rows["gpu-box"]
    assert "llama.cpp / cpu" in rows["laptop"]
    assert "ollama / -" in rows["external-lab-ollama"]
    # The residencies column folds on a narrow table: compare without the layout's spaces.
    assert "external-lab-ollamaacceptingollama/-" in "".join(text.split())
    assert "llama3:8b:ready(external)" in "".join(text.split())


def test_status_shows_each_hosts_cached_weights_and_which_a_prediction_fetched(
    grid: Grid,
) -> None:
    """An operator sees which cache on a host is an unused predictive download (the only kind
    the predictive lifecycle may expire or replace) and which is ordinary cache."""
    sha_b, sha_c = "b" * 64, "c" * 64
    cached = [
        {"model_id": "b.gguf", "artifact_sha256": sha_b, "size_mb": 6, "predictive": True,
         "cached_age_s": 30.0},
        {"model_id": "c.gguf", "artifact_sha256": sha_c, "size_mb": 6},
    ]  # fmt: skip
    managed = ["load", "warm", "drain", "unload", "evict"]
    _put(grid, "worker", {"capacity_mb": 8192, "runtimes": ["llama.cpp"]},
         {"cached_artifacts": cached, "actuator_capabilities": managed})  # fmt: skip
    grid.http.post(f"{grid.url}/allocator/tick", headers=grid.operator()).raise_for_status()

    # Without ?detail: which weights sit on which disk is part of the summary.
    doc = grid.http.get(f"{grid.url}/allocator/status", headers=grid.operator()).json()
    [host] = [h for h in doc["controller"]["hosts"] if h["host_id"] == "worker"]
    rows = {c["model_id"]: c for c in host["cached"]}
    assert (rows["b.gguf"]["artifact_sha256"], rows["b.gguf"]["predictive"]) == (sha_b, True)
    assert rows["b.gguf"]["cached_at"] <= doc["controller"]["last_tick_at"] - 29.0
    assert (rows["c.gguf"]["artifact_sha256"], rows["c.gguf"]["predictive"]) == (sha_c, False)
    assert rows["c.gguf"]["cached_at"] is None

    text = "".join(render_status(doc).split())
    assert "b.gguf:cached(predictive)c.gguf:cached" in text
    assert "c.gguf:cached(predictive)" not in text
