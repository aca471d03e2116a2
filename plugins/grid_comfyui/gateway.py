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
import asyncio
import base64
import hmac
import json
import sys
import time
from pathlib import Path

import httpx
from aiohttp import web

from grid_comfyui.comfy import run_workflow
from grid_comfyui.manifest import Manifest, fill, missing_on_server, parse_manifest
from grid_core.api import GridError, ValidationError

GENERATION_TIMEOUT_S = 900.0
"""Longest one image may take (a large SDXL image with many steps on a small GPU)."""
PROBE_TIMEOUT_S = 5.0
IMAGE_ROUTE = "/v1/media/image/generate"


class Gateway:
    def __init__(self, manifest: Manifest, keys: set[str], upstream: str) -> None:
        self.manifest = manifest
        self.keys = keys
        self.upstream = upstream.rstrip("/")
        self.active = 0

    def authorized(self, request: web.Request) -> bool:
        got = request.headers.get("Authorization", "")
        return any(hmac.compare_digest(got, f"Bearer {k}") for k in self.keys)

    @staticmethod
    def error(status: int, message: str, kind: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": kind}}, status=status)

    async def health(self, _: web.Request) -> web.Response:
        try:
            async with httpx.AsyncClient(
                base_url=self.upstream, timeout=PROBE_TIMEOUT_S, trust_env=False
            ) as c:
                stats = await c.get("/system_stats")
                info = await c.get("/object_info")
            if stats.status_code != 200 or info.status_code != 200:
                return web.json_response({"status": "ComfyUI not answering"}, status=503)
            missing = missing_on_server(self.manifest, info.json())
        except (httpx.HTTPError, ValueError):
            return web.json_response({"status": "ComfyUI unreachable"}, status=503)
        if missing:
            return web.json_response({"status": f"missing: {', '.join(missing)}"}, status=503)
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return self.error(401, "invalid api key", "authentication_error")
        doc = {"object": "list", "data": [{"id": self.manifest.id, "object": "model"}]}
        return web.json_response(doc)

    async def activity(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return self.error(401, "invalid api key", "authentication_error")
        return web.json_response({"active": self.active})

    async def generate(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return self.error(401, "invalid api key", "authentication_error")
        try:
            body = await request.json()
        except ValueError:
            return self.error(400, "request body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return self.error(400, "request body must be an object", "invalid_request_error")
        fmt = body.get("response_format", "png")
        if fmt not in ("png", "b64_json"):
            return self.error(400, "response_format: use png or b64_json", "invalid_request_error")
        self.active += 1
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
        finally:
            self.active -= 1
        if fmt == "b64_json":
            data = [{"b64_json": base64.b64encode(image).decode()}]
            return web.json_response({"created": int(time.time()), "data": data})
        return web.Response(body=image, content_type="image/png")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/grid/activity", self.activity)
        app.router.add_post(IMAGE_ROUTE, self.generate)
        return app


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grid-comfyui-gateway")
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key-file", type=Path, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--manifest", type=Path, required=True)
    args = p.parse_args(argv)
    manifest = parse_manifest(args.manifest.read_bytes(), str(args.manifest))
    keys = {k.strip() for k in args.api_key_file.read_text().splitlines() if k.strip()}
    gw = Gateway(manifest, keys, args.upstream)
    runner = web.AppRunner(gw.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    print(json.dumps({"gateway": "comfyui", "model": args.model, "port": args.port}), flush=True)
    await asyncio.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
