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
import sys
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from grid_core.api import EngineGateway, GatewayHandler, run_gateway
from grid_ollama.normalize import PINNED_KEEP_ALIVE, normalize

RELAYED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
UPSTREAM_TIMEOUT_S = 3600.0
"""Longest one relayed request may take (a long generation on a slow GPU)."""
PROBE_TIMEOUT_S = 5.0
"""Seconds for Ollama's ``/api/ps`` to answer a health check (loopback: milliseconds)."""
MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest relayed request body: long chat histories and embedding batches run to megabytes."""
FOREVER_AFTER_S = 10 * 365 * 86400
"""An expiry further away than this is "pinned" (Ollama reports a negative keep_alive as a
date centuries ahead)."""


class Gateway(EngineGateway):
    """The Ollama gateway of one model (see the module docstring).

    Args:
        model: the Ollama tag served.
        keys: accepted engine keys.
        upstream: Ollama's loopback URL.
        num_ctx: the context size (tokens) every request is pinned to.
    """

    max_body_bytes = MAX_BODY_BYTES

    def __init__(self, model: str, keys: set[str], upstream: str, num_ctx: int) -> None:
        super().__init__(model, keys, upstream)
        self.num_ctx = num_ctx
        self.session: aiohttp.ClientSession | None = None

    async def client(self) -> aiohttp.ClientSession:
        """The upstream session (made on first use, inside the event loop)."""
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
                return dict(row)
        return None

    async def pin(self) -> None:
        """Load the model again with keep-alive forever and the same context (no reload)."""
        s = await self.client()
        body = {
            "model": self.model,
            "keep_alive": PINNED_KEEP_ALIVE,
            "options": {"num_ctx": self.num_ctx},
        }
        async with s.post(f"{self.upstream}/api/generate", json=body) as r:
            await r.read()

    async def health(self, request: web.Request) -> web.Response:
        """200 when ``/api/ps`` lists the model; re-pins a shortened keep-alive."""
        try:
            row = await self.loaded()
            if row is None:
                return self.unready("model not loaded in Ollama")
            if not _pinned(str(row.get("expires_at", ""))):
                await self.pin()  # someone shortened keep_alive; same options: no reload
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return self.unready("Ollama unreachable")
        return web.json_response({"status": "ok"})

    def routes(self) -> list[tuple[str, GatewayHandler]]:
        """The OpenAI-compatible routes, each relayed after normalisation."""
        return [(path, self.relay) for path in RELAYED]

    async def relay(self, request: web.Request) -> web.StreamResponse:
        """Normalise the body, relay it to Ollama and stream the answer back."""
        body = await self.request_body(request)
        if isinstance(body, web.Response):
            return body
        fixed, overridden = normalize(body, model=self.model, num_ctx=self.num_ctx)
        if overridden:
            print(f"normalised {request.path}: {', '.join(overridden)}", flush=True)
        with self.in_flight():
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
                return self.error(502, f"Ollama unreachable: {exc}", "engine_error")


def _pinned(expires_at: str) -> bool:
    """Whether an ``/api/ps`` expiry is effectively never (a negative keep_alive)."""
    try:
        when = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return False
    return (when - datetime.now(UTC)).total_seconds() > FOREVER_AFTER_S


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-ctx", type=int, required=True)


def main(argv: list[str]) -> int:
    """Run the gateway (``python -m grid_ollama.gateway``)."""
    return run_gateway(
        argv,
        kind="ollama",
        add_arguments=_arguments,
        build=lambda args, keys: Gateway(args.model, keys, args.upstream, args.num_ctx),
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
