"""Workflow manifests: parsing, the fields a request may set, and what ComfyUI must offer."""

from __future__ import annotations

import json

import pytest
from fake_engines import write_workflow_manifest
from grid_comfyui.manifest import fill, missing_on_server, parse_manifest

from grid_core.errors import ValidationError


@pytest.fixture
def manifest(tmp_path):
    path = write_workflow_manifest(tmp_path / "image-sdxl.workflow.json", "image-sdxl")
    return parse_manifest(path.read_bytes(), str(path))


def test_fill_sets_mapped_inputs_and_leaves_the_manifest_alone(manifest) -> None:
    graph = fill(manifest, {"model": "image-sdxl", "prompt": "a cat", "seed": 3, "width": 128})
    assert graph["6"]["inputs"]["text"] == "a cat"
    assert graph["3"]["inputs"]["seed"] == 3 and graph["5"]["inputs"]["width"] == 128
    assert manifest.workflow["6"]["inputs"]["text"] == ""


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        ({}, "prompt"),
        ({"prompt": "x", "width": 100}, "width"),
        ({"prompt": "x", "steps": 0}, "steps"),
        ({"prompt": "x", "seed": True}, "seed"),
        ({"prompt": "x", "cfg": 3}, "cfg"),
    ],
)
def test_bad_requests_name_the_field(manifest, request_body, field) -> None:
    with pytest.raises(ValidationError, match=field):
        fill(manifest, request_body)


def test_a_mapping_to_a_missing_node_is_refused(tmp_path) -> None:
    path = write_workflow_manifest(tmp_path / "m.workflow.json", "m")
    doc = json.loads(path.read_text())
    doc["inputs"]["seed"] = ["99", "seed"]
    with pytest.raises(ValidationError, match=r"inputs\.seed"):
        parse_manifest(json.dumps(doc).encode(), "m.workflow.json")


def test_missing_node_classes_and_checkpoints_are_listed(manifest) -> None:
    info = {c: {} for c in ("CLIPTextEncode", "KSampler", "VAEDecode", "SaveImage")}
    info["CheckpointLoaderSimple"] = {"input": {"required": {"ckpt_name": [["other.safetensors"]]}}}
    assert missing_on_server(manifest, info) == [
        "node class EmptyLatentImage",
        "checkpoint fake-sd.safetensors",
    ]
