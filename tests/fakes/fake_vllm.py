#!/usr/bin/env python3
"""FAKE vLLM for tests: ``fake_vllm.py serve MODEL [vLLM's flags]`` (no GPU, no weights).

It mimics what Grid relies on in ``vllm serve`` (vLLM's OpenAI-compatible server):

* the command line: ``serve MODEL --host --port --served-model-name --api-key --config
  --max-model-len --max-num-seqs --gpu-memory-utilization --revision --download-dir``;
  ``--config FILE`` is vLLM's YAML argument file (JSON is valid YAML; ``key: value`` lines
  are read too), the way Grid passes the API key without putting it in argv;
* start-up: the port opens only after the "weights" load (``start_delay_s``), as vLLM binds
  after loading; a MODEL that is not a directory with ``config.json`` exits 1;
* routes: ``GET /health`` (unauthenticated, 200), ``GET /metrics`` (unauthenticated,
  Prometheus text with ``vllm:num_requests_running``), and with ``--api-key`` every
  ``/v1/*`` route requires ``Authorization: Bearer KEY`` (401 otherwise): ``GET /v1/models``,
  ``POST /v1/chat/completions`` and ``/v1/completions`` with ``stream`` (server-sent events
  ending in ``data: [DONE]``); an unknown model is 404;
* crashes: ``crash_after_s`` in ``MODEL/fake-engine.json`` ends the process abruptly.

Events (ready, requests) go to ``MODEL.fake-events.jsonl`` (beside, not inside, the snapshot).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakekit import EventLog, behaviour, generation_response

DEFAULT_TOKEN_DELAY_S = 0.01
"""Seconds per generated token unless the model's knobs say otherwise."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("model")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-model-name", nargs="+")
    s.add_argument("--api-key")
    s.add_argument("--config")
    s.add_argument("--max-model-len", type=int)
    s.add_argument("--max-num-seqs", type=int, default=256)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    s.add_argument("--revision")
    s.add_argument("--download-dir")
    s.add_argument("--disable-log-requests", action="store_true")
    args = s.parse_args(argv[1:]) if argv and argv[0] == "serve" else p.parse_args(argv)
    if args.config:
        for key, value in read_config(Path(args.config)).items():
            attr = key.replace("-", "_")
            if getattr(args, attr, None) in (None, s.get_default(attr)):
                setattr(args, attr, value)
    return args


def read_config(path: Path) -> dict[str, Any]:
    """vLLM's ``--config`` YAML: JSON (a YAML subset) or flat ``key: value`` lines."""
    text = path.read_text()
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else {}
    except ValueError:
        out: dict[str, Any] = {}
        for line in text.splitlines():
            if ":" in line and not line.lstrip().startswith("#"):
                k, v = line.split(":", 1)
                out[k.strip()] = v.strip().strip("'\"")
        return out


class FakeVllm:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.model_dir = Path(args.model)
        self.names = list(args.served_model_name or [args.model])
        self.knobs = behaviour(self.model_dir / "fake-engine.json")
        # Outside the snapshot directory, whose files are its identity.
        self.log = EventLog(Path(f"{self.model_dir}.fake-events.jsonl"))
        self.running = 0

    def authorized(self, request: web.Request) -> bool:
        if not self.args.api_key:
            return True
        return request.headers.get("Authorization") == f"Bearer {self.args.api_key}"

    @web.middleware
    async def auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1") and not self.authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, _: web.Request) -> web.Response:
        name = self.names[0]
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{name}"}} {float(self.running)}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{name}"}} 0.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def models(self, _: web.Request) -> web.Response:
        data = [
            {
                "id": n,
                "object": "model",
                "owned_by": "vllm",
                "root": str(self.model_dir),
                "max_model_len": self.args.max_model_len or 4096,
            }
            for n in self.names
        ]
        return web.json_response({"object": "list", "data": data})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "invalid JSON"}, status=400)
        model = body.get("model", self.names[0])
        if model not in self.names:
            msg = f"The model `{model}` does not exist."
            return web.json_response({"object": "error", "message": msg, "code": 404}, status=404)
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        delay = float(self.knobs.get("token_delay_s", DEFAULT_TOKEN_DELAY_S))
        self.running += 1
        self.log.write("request", route=request.path, model=model, max_tokens=n)
        try:
            return await generation_response(request, body, model, n, delay, chat=chat)
        finally:
            self.running -= 1

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.auth])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/v1/completions", self.generate)
        return app


async def main(argv: list[str]) -> int:
    args = parse_args(argv)
    fake = FakeVllm(args)
    if not (fake.model_dir / "config.json").is_file():
        print(f"fake vllm: {args.model} is not a model directory with config.json", flush=True)
        return 1
    if fake.knobs.get("exit_at_start"):
        print(f"fake vllm: {fake.knobs['exit_at_start']}", flush=True)
        return 1
    print(f"fake vllm: loading {args.model}", flush=True)
    await asyncio.sleep(float(fake.knobs.get("start_delay_s", 0.0)))
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    fake.log.write("ready", port=args.port, pid=os.getpid())
    print(f"fake vllm: serving {fake.names} on {args.host}:{args.port}", flush=True)
    crash = fake.knobs.get("crash_after_s")
    if crash is not None:
        await asyncio.sleep(float(crash))
        fake.log.write("crash")
        os._exit(134)  # as an engine that dies in a CUDA error: no cleanup at all
    await asyncio.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
