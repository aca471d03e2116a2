"""Running one workflow on a ComfyUI server: submit, wait for its history, fetch the image.

ComfyUI's HTTP protocol: ``POST /prompt`` queues an API-format graph and returns a
``prompt_id``; ``GET /history/{prompt_id}`` is empty until the graph ran, then lists each
output node's images; ``GET /view`` returns an image file.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx

from grid_core.api import UnavailableError, ValidationError

POLL_INTERVAL_S = 0.1
"""History polling period: a short generation finishes within a few polls."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


async def run_workflow(
    client: httpx.AsyncClient, graph: dict[str, Any], output: str, timeout_s: float
) -> bytes:
    """Queue ``graph``, wait up to ``timeout_s`` seconds and return the output node's image.

    Raises:
        ValidationError: ComfyUI refused the graph (its node errors are quoted).
        UnavailableError: no answer, no image within ``timeout_s``, or not a PNG.
    """
    r = await client.post("/prompt", json={"prompt": graph, "client_id": str(uuid.uuid4())})
    if r.status_code == 400:
        msg = f"ComfyUI refused the workflow: {r.text[:300]}"
        raise ValidationError(msg)
    if r.status_code != 200:
        msg = f"ComfyUI /prompt answered HTTP {r.status_code}"
        raise UnavailableError(msg)
    prompt_id = r.json()["prompt_id"]
    entry: dict[str, Any] | None = None
    with anyio.move_on_after(timeout_s):
        while entry is None:
            h = await client.get(f"/history/{prompt_id}")
            entry = h.json().get(prompt_id) if h.status_code == 200 else None
            if entry is None:
                await anyio.sleep(POLL_INTERVAL_S)
    if entry is None:
        msg = f"ComfyUI did not finish prompt {prompt_id} within {timeout_s:.0f} s"
        raise UnavailableError(msg)
    status = entry.get("status", {})
    images = entry.get("outputs", {}).get(output, {}).get("images", [])
    if status.get("status_str") not in (None, "success") or not images:
        msg = f"ComfyUI prompt {prompt_id} produced no image ({status.get('status_str')})"
        raise UnavailableError(msg)
    img = images[0]
    v = await client.get(
        "/view",
        params={
            "filename": img["filename"],
            "subfolder": img.get("subfolder", ""),
            "type": img.get("type", "output"),
        },
    )
    if v.status_code != 200 or not v.content.startswith(PNG_SIGNATURE):
        msg = f"ComfyUI /view of {img['filename']} did not return a PNG (HTTP {v.status_code})"
        raise UnavailableError(msg)
    return v.content
