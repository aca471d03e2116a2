"""The ComfyUI gateway: Grid's authenticated image route for one workflow manifest.

ComfyUI has no API key and speaks workflow graphs, not an inference API. For every resident
workflow the node runs one gateway process (Grid-owned, identity proven like any engine
child) that answers ``POST /v1/media/image/generate`` with the engine key: it fills the
manifest's graph with the request's fields (:mod:`grid_comfyui.manifest`), runs it on the
loopback ComfyUI (:mod:`grid_comfyui.comfy`) and returns the PNG (``image/png``), or
``{"created", "data": [{"b64_json"}]}`` when ``response_format`` is ``b64_json``.
``/health`` is ComfyUI's own proof that the workflow is usable (``/object_info`` has every node
class and checkpoint); ``GET /grid/activity`` counts requests in flight for drain.

Run as ``python -m grid_comfyui.gateway --model ID --host H --port P --api-key-file F
--upstream URL --manifest PATH``.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path

import httpx
from aiohttp import web

from grid_comfyui.comfy import run_workflow
from grid_comfyui.manifest import Manifest, fill, missing_on_server, parse_manifest
from grid_core.api import EngineGateway, GatewayHandler, GridError, ValidationError, run_gateway

GENERATION_TIMEOUT_S = 900.0
"""Longest one image may take (a large SDXL image with many steps on a small GPU)."""
PROBE_TIMEOUT_S = 5.0
"""Seconds for ComfyUI's catalogue to answer a health check (loopback)."""
IMAGE_ROUTE = "/v1/media/image/generate"


class Gateway(EngineGateway):
    """The ComfyUI gateway of one workflow manifest (see the module docstring).

    Args:
        manifest: the verified workflow manifest (its id is the model served).
        keys: accepted engine keys.
        upstream: ComfyUI's loopback URL.
    """

    def __init__(self, manifest: Manifest, keys: set[str], upstream: str) -> None:
        super().__init__(manifest.id, keys, upstream)
        self.manifest = manifest

    async def health(self, request: web.Request) -> web.Response:
        """200 when ComfyUI offers every node class and checkpoint the workflow uses."""
        try:
            async with httpx.AsyncClient(
                base_url=self.upstream, timeout=PROBE_TIMEOUT_S, trust_env=False
            ) as c:
                stats = await c.get("/system_stats")
                info = await c.get("/object_info")
            if stats.status_code != 200 or info.status_code != 200:
                return self.unready("ComfyUI not answering")
            missing = missing_on_server(self.manifest, info.json())
        except (httpx.HTTPError, ValueError):
            return self.unready("ComfyUI unreachable")
        if missing:
            return self.unready(f"missing: {', '.join(missing)}")
        return web.json_response({"status": "ok"})

    def routes(self) -> list[tuple[str, GatewayHandler]]:
        """The image route."""
        return [(IMAGE_ROUTE, self.generate)]

    async def generate(self, request: web.Request) -> web.Response:
        """Fill the workflow with the request's fields, run it, return the PNG."""
        body = await self.request_body(request)
        if isinstance(body, web.Response):
            return body
        fmt = body.get("response_format", "png")
        if fmt not in ("png", "b64_json"):
            return self.error(400, "response_format: use png or b64_json", "invalid_request_error")
        with self.in_flight():
            try:
                graph = fill(self.manifest, body)
                async with httpx.AsyncClient(
                    base_url=self.upstream, timeout=GENERATION_TIMEOUT_S, trust_env=False
                ) as c:
                    image = await run_workflow(c, graph, self.manifest.output, GENERATION_TIMEOUT_S)
            except ValidationError as exc:
                return self.error(400, str(exc), "invalid_request_error")
            except (GridError, httpx.HTTPError) as exc:
                return self.error(502, f"ComfyUI failed: {exc}", "engine_error")
        if fmt == "b64_json":
            data = [{"b64_json": base64.b64encode(image).decode()}]
            return web.json_response({"created": int(time.time()), "data": data})
        return web.Response(body=image, content_type="image/png")


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--manifest", type=Path, required=True)


def _build(args: argparse.Namespace, keys: set[str]) -> Gateway:
    manifest = parse_manifest(args.manifest.read_bytes(), str(args.manifest))
    return Gateway(manifest, keys, args.upstream)


def main(argv: list[str]) -> int:
    """Run the gateway (``python -m grid_comfyui.gateway``)."""
    return run_gateway(argv, kind="comfyui", add_arguments=_arguments, build=_build)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
