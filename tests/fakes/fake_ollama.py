#!/usr/bin/env python3
"""FAKE Ollama service for tests: ``fake_ollama.py serve`` (no GPU, no weights).

It mimics the parts of Ollama's documented REST API that Grid relies on:

* the service binds ``OLLAMA_HOST`` (``host:port``; port 0 picks a free one, written to
  ``--port-file``) and keeps models under ``OLLAMA_MODELS`` (``manifest.json`` there lists
  local tags with their registry digest and size);
* ``GET /`` ("Ollama is running"), ``GET /api/version``, ``GET /api/tags``, ``POST /api/show``,
  ``GET /api/ps`` (loaded models with ``expires_at`` and ``size_vram``), ``POST /api/pull``
  (from the ``--registry`` JSON; like Ollama it silently overwrites an existing tag);
* memory control through ``keep_alive``: ``POST /api/generate`` with no prompt loads a model
  (``keep_alive`` < 0 keeps it forever, a duration or seconds sets its expiry, ``0`` unloads
  it); a request whose ``options.num_ctx`` differs from the loaded one reloads the model;
* the OpenAI-compatible routes ``GET /v1/models``, ``POST /v1/chat/completions`` and
  ``/v1/completions`` (``stream`` supported). The fake applies ``keep_alive`` and
  ``options.num_ctx`` (or a top-level ``num_ctx``) on these routes too — the strict case,
  so a test proves that Grid's normalisation, not a lenient engine, prevents reload thrash.

Every load, unload, reload, pull and request is appended to ``--log`` (JSON lines).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakekit import EventLog, generation_response, serve, token

DEFAULT_KEEP_ALIVE_S = 300.0
"""Ollama's default keep_alive (5 minutes) when a request names none."""
DEFAULT_NUM_CTX = 2048
"""Context size a model loads with when a request names none (Ollama's default)."""
LOAD_DELAY_S = 0.05
"""Seconds a fake load takes: long enough to be a distinct event in the log."""
TOKEN_DELAY_S = 0.01
EXPIRY_TICK_S = 0.1
DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")


def keep_alive_seconds(value: Any) -> float | None:
    """Seconds a model stays loaded; ``None`` = forever (negative), 0 = unload now."""
    if value is None:
        return DEFAULT_KEEP_ALIVE_S
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value < 0 else float(value)
    m = DURATION.match(str(value))
    if m is None:
        raise ValueError(f"invalid keep_alive {value!r}")
    n = float(m.group(1))
    unit = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[m.group(2)]
    return None if n < 0 else n * unit


class FakeOllama:
    def __init__(self, models_dir: Path, registry: Path | None, log: Path | None) -> None:
        self.models_dir = models_dir
        self.registry = registry
        self.log = EventLog(log)
        self.loaded: dict[str, dict[str, Any]] = {}
        self.lock = asyncio.Lock()

    # --- store ------------------------------------------------------------------------
    def manifest(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads((self.models_dir / "manifest.json").read_text())
        except FileNotFoundError:
            return {}

    def save_manifest(self, doc: dict[str, dict[str, Any]]) -> None:
        self.models_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.models_dir / "manifest.json.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.models_dir / "manifest.json")

    @staticmethod
    def canonical(name: str) -> str:
        return name if ":" in name else f"{name}:latest"

    def local(self, name: str) -> dict[str, Any] | None:
        return self.manifest().get(self.canonical(name))

    # --- memory -------------------------------------------------------------------------
    async def ensure(self, name: str, keep_alive: Any, num_ctx: int | None, route: str) -> str:
        """Load (or reload) ``name`` as a request asks; returns an error text or ''."""
        name = self.canonical(name)
        if self.local(name) is None:
            return f"model '{name}' not found"
        try:
            ttl = keep_alive_seconds(keep_alive)
        except ValueError as exc:
            return str(exc)
        async with self.lock:
            cur = self.loaded.get(name)
            want_ctx = num_ctx or (cur["num_ctx"] if cur else DEFAULT_NUM_CTX)
            if cur is not None and cur["num_ctx"] != want_ctx:
                self.log.write("reload", model=name, route=route, num_ctx=want_ctx)
                del self.loaded[name]
                cur = None
            if cur is None:
                await asyncio.sleep(LOAD_DELAY_S)
                self.log.write("load", model=name, route=route, num_ctx=want_ctx)
                cur = {"num_ctx": want_ctx, "expires_at": None}
                self.loaded[name] = cur
            cur["keep_alive"] = ttl
            cur["expires_at"] = None if ttl is None else time.time() + ttl
        return ""

    async def after_request(self, name: str, route: str) -> None:
        name = self.canonical(name)
        async with self.lock:
            cur = self.loaded.get(name)
            if cur is not None and cur.get("keep_alive") == 0:
                del self.loaded[name]
                self.log.write("unload", model=name, route=route, reason="keep_alive 0")

    async def unload(self, name: str, route: str) -> None:
        name = self.canonical(name)
        async with self.lock:
            if self.loaded.pop(name, None) is not None:
                self.log.write("unload", model=name, route=route, reason="keep_alive 0")

    async def expire(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_TICK_S)
            now = time.time()
            async with self.lock:
                for name, cur in list(self.loaded.items()):
                    if cur["expires_at"] is not None and cur["expires_at"] <= now:
                        del self.loaded[name]
                        self.log.write("unload", model=name, reason="expired")

    # --- native API ---------------------------------------------------------------------
    async def root(self, _: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0-fake"})

    def details(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {
            "format": "gguf",
            "family": entry.get("family", "llama"),
            "parameter_size": entry.get("parameter_size", "1B"),
            "quantization_level": entry.get("quantization_level", "Q4_K_M"),
        }

    async def tags(self, _: web.Request) -> web.Response:
        rows = [
            {
                "name": name,
                "model": name,
                "modified_at": "2026-01-01T00:00:00Z",
                "size": entry["size"],
                "digest": entry["digest"],
                "details": self.details(entry),
            }
            for name, entry in sorted(self.manifest().items())
        ]
        return web.json_response({"models": rows})

    async def show(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body.get("model") or body.get("name") or ""
        entry = self.local(name)
        if entry is None:
            return web.json_response({"error": f"model '{name}' not found"}, status=404)
        return web.json_response(
            {
                "modelfile": f"FROM {name}",
                "parameters": "",
                "template": "{{ .Prompt }}",
                "details": self.details(entry),
                "model_info": {"general.architecture": "llama"},
            }
        )

    async def ps(self, _: web.Request) -> web.Response:
        rows = []
        for name, cur in sorted(self.loaded.items()):
            entry = self.local(name) or {"size": 0, "digest": ""}
            exp = cur["expires_at"]
            expires = (
                "2318-01-01T00:00:00Z"
                if exp is None
                else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp))
            )
            rows.append(
                {
                    "name": name,
                    "model": name,
                    "size": entry["size"],
                    "digest": entry["digest"],
                    "details": self.details(entry),
                    "expires_at": expires,
                    "size_vram": entry["size"],
                    "context_length": cur["num_ctx"],
                }
            )
        return web.json_response({"models": rows})

    async def pull(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = self.canonical(body.get("model") or body.get("name") or "")
        try:
            registry = json.loads(self.registry.read_text()) if self.registry else {}
        except FileNotFoundError:
            registry = {}
        entry = registry.get(name)
        if entry is None:
            return web.json_response(
                {"error": "pull model manifest: file does not exist"}, status=500
            )
        manifest = self.manifest()
        manifest[name] = entry  # Ollama overwrites an existing tag without asking
        self.save_manifest(manifest)
        self.log.write("pull", model=name, digest=entry["digest"])
        if body.get("stream") is False:
            return web.json_response({"status": "success"})
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        for line in (
            {"status": "pulling manifest"},
            {
                "status": f"pulling {entry['digest'][:12]}",
                "digest": f"sha256:{entry['digest']}",
                "total": entry["size"],
                "completed": entry["size"],
            },
            {"status": "verifying sha256 digest"},
            {"status": "success"},
        ):
            await resp.write((json.dumps(line) + "\n").encode())
        await resp.write_eof()
        return resp

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = body.get("model", "")
        prompt = body.get("prompt") or ""
        options = body.get("options") or {}
        self.log.write(
            "request",
            route=request.path,
            model=name,
            keep_alive=body.get("keep_alive"),
            num_ctx=options.get("num_ctx"),
        )
        if not prompt and body.get("keep_alive") in (0, "0", "0s", "0m"):
            await self.unload(name, request.path)
            return web.json_response({"model": name, "done": True, "done_reason": "unload"})
        err = await self.ensure(name, body.get("keep_alive"), options.get("num_ctx"), request.path)
        if err:
            return web.json_response({"error": err}, status=404)
        if not prompt:
            return web.json_response({"model": name, "done": True, "done_reason": "load"})
        n = int(options.get("num_predict") or 16)
        await asyncio.sleep(TOKEN_DELAY_S * n)
        text = "".join(token(i) for i in range(n))
        await self.after_request(name, request.path)
        return web.json_response({"model": name, "response": text, "done": True, "eval_count": n})

    # --- OpenAI-compatible --------------------------------------------------------------
    async def v1_models(self, _: web.Request) -> web.Response:
        data = [{"id": n, "object": "model", "owned_by": "library"} for n in self.manifest()]
        return web.json_response({"object": "list", "data": data})

    async def v1_generate(self, request: web.Request) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        body = await request.json()
        name = body.get("model", "")
        options = body.get("options") or {}
        num_ctx = options.get("num_ctx", body.get("num_ctx"))
        self.log.write(
            "request",
            route=request.path,
            model=name,
            keep_alive=body.get("keep_alive"),
            num_ctx=num_ctx,
        )
        err = await self.ensure(name, body.get("keep_alive"), num_ctx, request.path)
        if err:
            return web.json_response({"error": {"message": err, "type": "api_error"}}, status=404)
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        try:
            return await generation_response(request, body, name, n, TOKEN_DELAY_S, chat=chat)
        finally:
            await self.after_request(name, request.path)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self.root)
        app.router.add_get("/api/version", self.version)
        app.router.add_get("/api/tags", self.tags)
        app.router.add_post("/api/show", self.show)
        app.router.add_get("/api/ps", self.ps)
        app.router.add_post("/api/pull", self.pull)
        app.router.add_post("/api/generate", self.generate)
        app.router.add_get("/v1/models", self.v1_models)
        app.router.add_post("/v1/chat/completions", self.v1_generate)
        app.router.add_post("/v1/completions", self.v1_generate)
        return app


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ollama")
    p.add_argument("command", choices=["serve"])
    p.add_argument("--registry", type=Path, help="JSON of pullable tags: digest and size")
    p.add_argument("--log", type=Path, help="JSON lines event log")
    p.add_argument("--port-file", type=Path, help="write the bound port here")
    args = p.parse_args(argv)
    host, _, port = os.environ.get("OLLAMA_HOST", "127.0.0.1:11434").rpartition(":")
    models = Path(os.environ.get("OLLAMA_MODELS", Path.home() / ".ollama" / "models"))
    fake = FakeOllama(models, args.registry, args.log)
    bound = await serve(fake.app(), host or "127.0.0.1", int(port), args.port_file)
    print(f"fake ollama: listening on {host}:{bound}", flush=True)
    await fake.expire()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
