"""The Ollama gateway: Grid's authenticated route to one model of a loopback Ollama service.

Ollama has no API key and must stay on loopback, and its memory follows whatever each request
says. For every resident Ollama model the node runs one gateway process (Grid-owned, identity
proven like any engine child) that:

* answers only requests carrying the engine key (``Authorization: Bearer``; the key is read
  from the 0600 key file, never argv or the environment);
* normalises each request (:mod:`grid_ollama.normalize`) so routed traffic cannot unload or
  reload the model, then relays it to Ollama's OpenAI-compatible route, streaming included;
* reports readiness from Ollama's own ``/api/ps`` (the model is loaded) and re-pins the
  model's keep-alive when a request from outside Grid shortened it;
* counts requests in flight (``GET /grid/activity``) so drain knows when it is idle.

Run as ``python -m grid_ollama.gateway --model TAG --host H --port P --api-key-file F
--upstream URL --num-ctx N``.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from grid_ollama.normalize import PINNED_KEEP_ALIVE, normalize

RELAYED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
UPSTREAM_TIMEOUT_S = 3600.0
"""Longest one relayed request may take (a long generation on a slow GPU)."""
PROBE_TIMEOUT_S = 5.0
FOREVER_AFTER_S = 10 * 365 * 86400
"""An expiry further away than this is "pinned" (Ollama reports a negative keep_alive as a
date centuries ahead)."""


class Gateway:
    def __init__(self, model: str, keys: set[str], upstream: str, num_ctx: int) -> None:
        self.model = model
        self.keys = keys
        self.upstream = upstream.rstrip("/")
        self.num_ctx = num_ctx
        self.active = 0
        self.session: aiohttp.ClientSession | None = None

    def authorized(self, request: web.Request) -> bool:
        got = request.headers.get("Authorization", "")
        return any(hmac.compare_digest(got, f"Bearer {k}") for k in self.keys)

    async def client(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_S)
            )
        return self.session

    async def loaded(self) -> dict[str, Any] | None:
        """This model's row in Ollama's ``/api/ps``, ``None`` when not loaded."""
        s = await self.client()
        async with s.get(
            f"{self.upstream}/api/ps", timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        ) as r:
            if r.status != 200:
                return None
            doc = await r.json()
        for row in doc.get("models", []):
            if row.get("name") == self.model or row.get("model") == self.model:
                return row
        return None

    async def pin(self) -> None:
        s = await self.client()
        body = {
            "model": self.model,
            "keep_alive": PINNED_KEEP_ALIVE,
            "options": {"num_ctx": self.num_ctx},
        }
        async with s.post(f"{self.upstream}/api/generate", json=body) as r:
            await r.read()

    async def health(self, _: web.Request) -> web.Response:
        try:
            row = await self.loaded()
            if row is None:
                return web.json_response({"status": "model not loaded in Ollama"}, status=503)
            if not _pinned(str(row.get("expires_at", ""))):
                await self.pin()  # someone shortened keep_alive; same options: no reload
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return web.json_response({"status": "Ollama unreachable"}, status=503)
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return web.json_response({"error": "invalid api key"}, status=401)
        doc = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        return web.json_response(doc)

    async def activity(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return web.json_response({"error": "invalid api key"}, status=401)
        return web.json_response({"active": self.active})

    async def relay(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "body must be an object"}}, status=400)
        fixed, overridden = normalize(body, model=self.model, num_ctx=self.num_ctx)
        if overridden:
            print(f"normalised {request.path}: {', '.join(overridden)}", flush=True)
        self.active += 1
        try:
            s = await self.client()
            async with s.post(f"{self.upstream}{request.path}", json=fixed) as up:
                resp = web.StreamResponse(status=up.status)
                ctype = up.headers.get("Content-Type")
                if ctype:
                    resp.content_type = ctype.split(";")[0]
                await resp.prepare(request)
                async for block in up.content.iter_any():
                    await resp.write(block)
                await resp.write_eof()
                return resp
        except aiohttp.ClientError as exc:
            msg = {"error": {"message": f"Ollama unreachable: {exc}"}}
            return web.json_response(msg, status=502)
        finally:
            self.active -= 1

    def app(self) -> web.Application:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/grid/activity", self.activity)
        for path in RELAYED:
            app.router.add_post(path, self.relay)
        return app


def _pinned(expires_at: str) -> bool:
    """Whether an ``/api/ps`` expiry is effectively never (a negative keep_alive)."""
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return False
    return (when - datetime.now(UTC)).total_seconds() > FOREVER_AFTER_S


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grid-ollama-gateway")
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key-file", type=Path, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--num-ctx", type=int, required=True)
    args = p.parse_args(argv)
    keys = {k.strip() for k in args.api_key_file.read_text().splitlines() if k.strip()}
    gw = Gateway(args.model, keys, args.upstream, args.num_ctx)
    runner = web.AppRunner(gw.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    print(json.dumps({"gateway": "ollama", "model": args.model, "port": args.port}), flush=True)
    await asyncio.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
