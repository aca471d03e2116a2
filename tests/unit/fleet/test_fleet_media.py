"""The logical fleet's media node, without processes: shares, hosts, the bundle, the options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grid_fleet import cli, layout, media

from grid_core.errors import ValidationError


def test_the_media_node_is_one_of_the_machines_and_gets_its_own_share(usable):
    assert layout.plan_capacities(3, None, media=True) == (6666,) * 3
    assert layout.plan_capacities(3, "4,2", media=True) == (4096, 2048, layout.MEDIA_HOST_MB)
    with pytest.raises(ValidationError, match="2 text node"):
        layout.plan_capacities(3, "4,2,2", media=True)
    with pytest.raises(ValidationError, match="--machines 2 or more"):
        layout.plan_capacities(1, None, media=True)


def test_media_host_offers_only_comfyui_and_its_comfyui_port_is_its_own():
    hosts = layout.host_specs((2048, 2048, 2048), 30000, media=True)
    assert [h.runtimes for h in hosts] == [("llama.cpp",), ("llama.cpp",), ("comfyui",)]
    assert [h.comfyui_url is not None for h in hosts] == [False, False, True]
    comfy_port = int(str(hosts[-1].comfyui_url).rsplit(":", 1)[1])
    engine_ports = {p for h in hosts for p in range(h.port_low, h.port_high + 1)}
    assert comfy_port not in engine_ports
    assert comfy_port < hosts[-1].port_low + layout.ENGINE_PORTS_PER_HOST


def _bundle(root: Path, model_id: str = "image-a", ckpt: str = "a.safetensors") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    doc = {"id": model_id, "workflow": {}, "checkpoints": [ckpt]}
    (root / f"{model_id}.workflow.json").write_text(json.dumps(doc))
    return root


def test_bundle_manifests_need_their_checkpoints_and_matching_names(tmp_path: Path):
    bundle = _bundle(tmp_path / "b")
    with pytest.raises(ValidationError, match=r"needs checkpoint a\.safetensors"):
        media.bundle_manifests(bundle)
    (bundle / "checkpoints").mkdir()
    (bundle / "checkpoints" / "a.safetensors").write_bytes(b"w")
    [(model_id, _, ckpts)] = media.bundle_manifests(bundle)
    assert (model_id, ckpts) == ("image-a", ["a.safetensors"])
    (bundle / "image-a.workflow.json").rename(bundle / "other.workflow.json")
    with pytest.raises(ValidationError, match=r"name it image-a\.workflow\.json"):
        media.bundle_manifests(bundle)
    with pytest.raises(ValidationError, match=r"no \*\.workflow\.json"):
        media.bundle_manifests(tmp_path)
    traversal = _bundle(tmp_path / "t", ckpt="../a.safetensors")
    with pytest.raises(ValidationError, match="needs checkpoint"):
        media.bundle_manifests(traversal)
    no_id = tmp_path / "n"
    no_id.mkdir()
    (no_id / "x.workflow.json").write_text(json.dumps({"workflow": {}}))
    with pytest.raises(ValidationError, match=r"missing required field `id`.*needs at least"):
        media.bundle_manifests(no_id)


def test_prepared_workflows_are_comfyui_profiles_starting_cold(tmp_path: Path):
    bundle = _bundle(tmp_path / "b")
    (bundle / "a.safetensors").write_bytes(b"w")
    [spec] = media.prepare_bundle(tmp_path / "fleet", bundle, 4096)
    doc = layout.profile_document(spec)
    assert doc["runtimes"] == ["comfyui"] and doc["min_replicas"] == 0
    assert doc["memory_mb"] == 2048 and len(str(doc["artifact_sha256"])) == 64
    assert (tmp_path / "fleet" / "comfyui" / "models" / "checkpoints" / "a.safetensors").is_file()
    assert (media.model_dir(tmp_path / "fleet") / "image-a.workflow.json").is_file()


def test_media_options_are_refused_in_one_line_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.delenv(media.EXECUTABLE_ENV, raising=False)
    bundle = _bundle(tmp_path / "b")
    (bundle / "a.safetensors").write_bytes(b"w")
    with pytest.raises(ValidationError, match="need --include-comfyui"):
        cli._media_options(False, bundle, None)
    with pytest.raises(ValidationError, match="needs --media-bundle"):
        cli._media_options(True, None, None)
    with pytest.raises(ValidationError, match="GRID_COMFYUI"):
        cli._media_options(True, bundle, None)
    with pytest.raises(ValidationError, match="no such executable"):
        cli._media_options(True, bundle, tmp_path / "missing")
    assert cli._media_options(False, None, None) == (None, None)
