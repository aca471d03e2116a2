"""ComfyUI's ``/free`` unloads every checkpoint at once, so Grid calls it only when the last
live workflow on the node stops: stopping one workflow must not make another, still serving,
reload its checkpoint on its next image. Runs against the FAKE ComfyUI server (a real process
on loopback speaking ComfyUI's HTTP API, clearly named as a fake)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_engines import comfyui_service, write_workflow_manifest
from grid_comfyui.adapter import ComfyUIAdapter
from grid_comfyui.manifest import parse_manifest

from grid_core.runtime import ChildRecord

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def _child(model_id: str) -> ChildRecord:
    return ChildRecord(runtime="comfyui", model_id=model_id, alias=model_id, pid=1, port=1)


async def test_free_waits_until_the_last_live_workflow_stops(tmp_path: Path) -> None:
    with comfyui_service(tmp_path) as svc:
        adapter = ComfyUIAdapter(svc.url)
        path = write_workflow_manifest(tmp_path / "m" / "image-a.workflow.json", "image-a")
        manifest = parse_manifest(path.read_bytes(), str(path))
        await adapter._generate(manifest, warmup=True)  # puts the checkpoint in memory
        assert svc.events("load")
        adapter.live |= {"image-a", "image-b"}  # two workflows' gateways are ready
        await adapter.after_stop(None, _child("image-a"))  # type: ignore[arg-type]  # unused
        assert svc.events("unload") == [], "image-b still serves: its checkpoint must stay"
        await adapter.after_stop(None, _child("image-b"))  # type: ignore[arg-type]  # unused
        assert [e["checkpoint"] for e in svc.events("unload")] == ["fake-sd.safetensors"]
