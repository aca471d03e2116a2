"""``grid test start --include-comfyui``: a logical fleet with a ComfyUI media node.

The media node runs the ComfyUI runtime plugin against the FAKE ComfyUI server
(``tests/fakes/fake_comfyui.py``, started by the fleet itself through ``--comfyui``, as it
would start a real ComfyUI); the text node runs a real llama-server. An image request
through the fleet's router finds the workflow cold (503 + Retry-After), its demand makes
the controller warm the workflow on the media node, and a later request gets a real PNG.
``grid test stop`` then leaves no process behind, ComfyUI included.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from fake_engines import comfyui_launcher, png_size, read_events, write_workflow_manifest
from fleet_cli import grid, owned, wait_for
from ports import port

from grid_core.system import is_gone, same_birth

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(23900)
"""Engine ports for this module's fleet (docs/testing.md): 10 per host."""
WORKFLOW = "image-fake-sd"
IMAGE = {"model": WORKFLOW, "prompt": "a lighthouse at dusk", "width": 64, "height": 96,
         "steps": 2, "seed": 7}  # fmt: skip
WARM_S = 300.0
"""Bound for demand → plan → warm → gateway on a loaded two-core machine (never asserted)."""


def media_bundle(root: Path) -> Path:
    """A bundle as an operator would lay it out: one manifest and the checkpoint it names."""
    bundle = root / "bundle"
    write_workflow_manifest(bundle / f"{WORKFLOW}.workflow.json", WORKFLOW, "fake-sd.safetensors")
    (bundle / "checkpoints").mkdir()
    (bundle / "checkpoints" / "fake-sd.safetensors").write_bytes(b"FAKE checkpoint weights")
    return bundle


def test_fleet_with_a_comfyui_media_node_serves_a_png_after_a_cold_503(tmp_path: Path) -> None:
    home = tmp_path / "home"
    events = tmp_path / "comfyui-events.jsonl"
    launcher = comfyui_launcher(tmp_path / "bin", log=events)
    started = grid(
        home, "test", "start", "--machines", "2", "--text-capacities-gib", "3",
        "--include-comfyui", "--media-bundle", str(media_bundle(tmp_path)),
        "--comfyui", str(launcher), "--port", "0", "--engine-port-base", str(ENGINE_PORT_BASE),
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"workflow {WORKFLOW}" in started.stdout and "ComfyUI pid" in started.stdout
        doc = json.loads(grid(home, "test", "status", "--json").stdout)
        text, media = doc["hosts"]
        assert (text["runtimes"], media["runtimes"]) == (["llama.cpp"], ["comfyui"])
        assert media["comfyui_url"].startswith("http://127.0.0.1:")
        url = doc["url"]

        # The operator's status shows what each node offers.
        status = json.loads(grid(home, "allocator", "status", "--grid", url, "--json").stdout)
        offered = {h["host_id"]: h["runtimes"] for h in status["controller"]["hosts"]}
        assert offered == {text["host_id"]: ["llama.cpp"], media["host_id"]: ["comfyui"]}

        with httpx.Client(base_url=url, timeout=120.0) as client:
            cold = client.post("/v1/media/image/generate", json=IMAGE)
            assert cold.status_code == 503, cold.text
            assert int(cold.headers["retry-after"]) >= 1

            def image() -> httpx.Response | None:
                r = client.post("/v1/media/image/generate", json=IMAGE)
                return r if r.status_code == 200 else None

            warm = wait_for(image, "the workflow to warm on the media node", timeout_s=WARM_S)
            assert warm.headers["content-type"].startswith("image/png")
            assert png_size(warm.content) == (64, 96)

        ctl = json.loads(grid(home, "allocator", "status", "--grid", url, "--json").stdout)
        where = {
            h["host_id"]: [r["model_id"] for r in h["residencies"] if r["state"] == "ready"]
            for h in ctl["controller"]["hosts"]
        }
        assert WORKFLOW in where[media["host_id"]] and WORKFLOW not in where[text["host_id"]]
        prompts = [e for e in read_events(events) if e["event"] == "prompt"]
        assert prompts, "the fake ComfyUI ran no prompt"
    finally:
        before = [(p.pid, p.create_time()) for p in owned(home)]
        stopped = grid(home, "test", "stop")
        left = [pid for pid, born in before if same_birth(pid, born) and not is_gone(pid)]
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "ComfyUI pid" in stopped.stdout and "stopped" in stopped.stdout
    assert not left, f"processes left after 'grid test stop': {left}"
    assert not owned(home)
    # The media node unloaded the workflow from accelerator memory before ComfyUI stopped.
    assert [e for e in read_events(events) if e["event"] == "unload"]
