"""Workflow manifests: the unit Grid deploys on ComfyUI (pure: parsing and filling only).

A ComfyUI "model" in Grid is a workflow, not a checkpoint name: the manifest pins the exact
API-format graph, which of its node inputs a request may set, the output node, and the
checkpoints that must already be installed (specification, "Operations": a workflow
manifest — not a mutable model name — is the safe unit of deployment). Its identity is the
SHA-256 of the manifest file. Manifests live in the node's model directories as
``<model id>.workflow.json``::

    {"id": "image-sdxl", "kind": "image", "workflow": {...API graph...},
     "inputs": {"prompt": ["6", "text"], "seed": ["3", "seed"], "width": ["5", "width"], ...},
     "output": "9", "checkpoints": ["sd_xl_base_1.0.safetensors"]}
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from grid_core.api import ValidationError

MANIFEST_SUFFIX = ".workflow.json"
MAX_SIDE_PX = 2048
"""Largest width or height a request may ask for: 4 megapixels per side squared is already
minutes of sampling on a consumer GPU."""
MIN_SIDE_PX = 64
SIDE_MULTIPLE = 8
"""Latent images are 1/8 of the pixel size, so sides must be multiples of 8."""
MAX_STEPS = 150
"""Sampler steps a request may ask for (quality stops improving long before)."""
MAX_PROMPT_CHARS = 10_000
"""Longest prompt text accepted (a CLIP encoder reads 77 tokens per chunk anyway)."""
REQUEST_FIELDS: dict[str, type] = {
    "prompt": str,
    "negative_prompt": str,
    "seed": int,
    "steps": int,
    "width": int,
    "height": int,
}
"""Request fields a manifest may map onto node inputs, with their types."""


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One workflow manifest.

    Attributes:
        id: the model id profiles and requests use.
        workflow: the ComfyUI API-format graph (node id → ``{class_type, inputs}``).
        inputs: request field → ``[node id, input name]`` it sets.
        output: node id whose images are the answer (a SaveImage node).
        checkpoints: checkpoint files the graph needs installed in ComfyUI.
        kind: what it produces (``image``).
    """

    id: str
    workflow: dict[str, dict[str, Any]]
    inputs: dict[str, tuple[str, str]]
    output: str
    checkpoints: list[str] = []
    kind: str = "image"


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """Decode and check a manifest.

    Raises:
        ValidationError: not a manifest, an unknown request field, or a mapping/output that
            names a node the graph lacks (the message names the file and the field).
    """
    try:
        m = msgspec.json.decode(raw, type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = f"workflow manifest {where}: {exc}"
        raise ValidationError(msg) from None
    for field, (node, _) in m.inputs.items():
        if field not in REQUEST_FIELDS:
            msg = (
                f"workflow manifest {where}: inputs.{field} is not one of {sorted(REQUEST_FIELDS)}"
            )
            raise ValidationError(msg)
        if node not in m.workflow:
            msg = f"workflow manifest {where}: inputs.{field} names node {node!r}, not in workflow"
            raise ValidationError(msg)
    if m.output not in m.workflow:
        msg = f"workflow manifest {where}: output node {m.output!r} is not in the workflow"
        raise ValidationError(msg)
    return m


def missing_on_server(m: Manifest, object_info: dict[str, Any]) -> list[str]:
    """What the ComfyUI server lacks to run ``m`` (node classes, checkpoints); empty = usable."""
    missing = sorted(
        {f"node class {n['class_type']}" for n in m.workflow.values()}
        - {f"node class {c}" for c in object_info}
    )
    loader = object_info.get("CheckpointLoaderSimple", {})
    choices = loader.get("input", {}).get("required", {}).get("ckpt_name", [[]])
    installed = set(choices[0]) if choices and isinstance(choices[0], list) else set()
    missing += [f"checkpoint {c}" for c in m.checkpoints if c not in installed]
    return missing


def _check(field: str, value: Any) -> Any:
    kind = REQUEST_FIELDS[field]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        msg = f"{field}: expected an integer, got {value!r}"
        raise ValidationError(msg)
    if kind is str and not isinstance(value, str):
        msg = f"{field}: expected a string"
        raise ValidationError(msg)
    if field in ("width", "height") and not (
        MIN_SIDE_PX <= value <= MAX_SIDE_PX and value % SIDE_MULTIPLE == 0
    ):
        msg = (
            f"{field}: {value} must be a multiple of {SIDE_MULTIPLE} "
            f"in {MIN_SIDE_PX}..{MAX_SIDE_PX}"
        )
        raise ValidationError(msg)
    if field == "steps" and not 1 <= value <= MAX_STEPS:
        msg = f"steps: {value} must be 1..{MAX_STEPS}"
        raise ValidationError(msg)
    if field == "seed" and not 0 <= value < 2**63:
        msg = f"seed: {value} must be 0..2^63-1"
        raise ValidationError(msg)
    if kind is str and len(value) > MAX_PROMPT_CHARS:
        msg = f"{field}: longer than {MAX_PROMPT_CHARS} characters"
        raise ValidationError(msg)
    return value


def fill(m: Manifest, request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The graph with the request's fields set (a copy; the manifest is unchanged).

    Args:
        m: the manifest.
        request: the decoded request body (``prompt`` required; ``model`` and
            ``response_format`` are not graph inputs and are ignored here).

    Raises:
        ValidationError: missing prompt, a field of the wrong type or out of bounds, or a
            field this workflow does not accept (the message names it).
    """
    if not isinstance(request.get("prompt"), str) or not request["prompt"].strip():
        msg = "prompt: a non-empty string is required"
        raise ValidationError(msg)
    graph = copy.deepcopy(m.workflow)
    for field, value in request.items():
        if field in ("model", "response_format", "n", "user"):
            continue
        if field not in REQUEST_FIELDS:
            msg = f"{field}: not a field of an image request ({', '.join(REQUEST_FIELDS)})"
            raise ValidationError(msg)
        if field not in m.inputs:
            msg = f"{field}: workflow {m.id} does not accept it (accepts {sorted(m.inputs)})"
            raise ValidationError(msg)
        node, name = m.inputs[field]
        graph[node].setdefault("inputs", {})[name] = _check(field, value)
    return graph
