"""FAKE OpenAI-compatible engine for tests and the proxy benchmark — never for real serving.

It speaks the llama-server HTTP shape Grid relies on: ``GET /health`` and ``GET /v1/models``
(public, as in llama-server), ``POST /v1/chat/completions`` / ``/v1/completions`` /
``/v1/embeddings`` with ``Authorization: Bearer <key>`` checked, SSE streaming with a final
usage chunk and ``data: [DONE]``. Replies are deterministic filler text, not inference.

Test controls (require the key too): ``POST /fake/behaviour`` with
``{"status": 500, "count": 2, "message": "...", "type": "...", "delay_ms": 0,
"token_delay_ms": 0, "tokens": 8, "word": "tok", "close_after_stream": false,
"embeddings": true}`` makes the next ``count`` requests answer ``status`` with that error
message/type (and sets response delay, per-token stream delay, default length and the filler
word: token ``i`` reads ``f"{word}{i}"``). ``close_after_stream`` closes the
connection right after a stream although keep-alive was announced (llama-server's fault);
``embeddings: false`` answers ``/v1/embeddings`` with 501 like llama-server started without
``--embeddings``. ``GET /fake/stats`` returns request counts by path and the wall-clock times
at which the fake saw a caller disconnect while it was still generating.

Run: ``python -m grid_server.fake_engine --model NAME --api-key-file F --url-file F``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import msgspec

from grid_core.system import write_atomic
from grid_server.proxy import Receive, Scope, Send, read_body, respond

DEFAULT_TOKENS = 8
"""Completion tokens per reply unless max_tokens asks for fewer or more."""
MAX_FAKE_TOKENS = 4096
"""Ceiling on filler tokens, so a test cannot make the fake allocate without bound."""
DEFAULT_WORD = "tok"
"""Filler word: token ``i`` of a reply reads ``tok{i}``."""
MAX_FAKE_WORD = 64
"""Longest filler word a test may set (characters)."""
JSON = [(b"content-type", b"application/json; charset=utf-8")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

URL_FILE_MODE = 0o644
"""The announced URL is no secret (the API key lives in its own 0600 file)."""


class FakeEngine:
    """The ASGI app. ``api_key=None`` disables the key check (like llama-server without one)."""

    def __init__(self, model: str, api_key: str | None) -> None:
        self.model = model
        self.api_key = api_key
        self.stats: Counter[str] = Counter()
        self.fail_status = 0
        self.fail_count = 0
        self.delay_ms = 0.0
        self.token_delay_ms = 0.0
        self.tokens = DEFAULT_TOKENS
        self.word = DEFAULT_WORD
        self.fail_message = "fake failure"
        self.fail_type: str | None = None
        self.close_after_stream = False
        self.embeddings = True
        self.cancelled_at: list[float] = []
        self.active = 0
        self.max_active = 0
        self._auth = f"Bearer {api_key}".encode() if api_key else None

    def _authorized(self, scope: Scope) -> bool:
        if self._auth is None:
            return True
        return any(k == b"authorization" and v == self._auth for k, v in scope["headers"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/health":
            await respond(send, 200, b'{"status":"ok"}', JSON)
            return
        if method == "GET" and path in ("/v1/models", "/models"):
            await respond(
                send,
                200,
                msgspec.json.encode(
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": self.model,
                                "object": "model",
                                "created": 0,
                                "owned_by": "llamacpp",
                            }
                        ],
                    }
                ),
                JSON,
            )
            return
        if not self._authorized(scope):
            await respond(
                send,
                401,
                b'{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}',
                JSON,
            )
            return
        body = await read_body(scope, receive)
        if path.startswith("/fake/"):
            await self._control(method, path, body, send)
            return
        if method != "POST" or path not in (
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
        ):
            await respond(
                send,
                404,
                b'{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}',
                JSON,
            )
            return
        self.stats[path] += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await self._infer(path, body, receive, send)
        finally:
            self.active -= 1

    async def _control(self, method: str, path: str, body: bytes, send: Send) -> None:
        """The test controls: ``POST /fake/behaviour`` and ``GET /fake/stats``."""
        if path == "/fake/behaviour" and method == "POST":
            cfg = json.loads(body or b"{}")
            self.fail_status = int(cfg.get("status", 0))
            self.fail_count = int(cfg.get("count", 0))
            self.delay_ms = float(cfg.get("delay_ms", 0.0))
            self.token_delay_ms = float(cfg.get("token_delay_ms", 0.0))
            self.tokens = min(MAX_FAKE_TOKENS, int(cfg.get("tokens", DEFAULT_TOKENS)))
            self.word = str(cfg.get("word", DEFAULT_WORD))[:MAX_FAKE_WORD]
            self.fail_message = str(cfg.get("message", "fake failure"))
            self.fail_type = cfg.get("type")
            self.close_after_stream = bool(cfg.get("close_after_stream", False))
            self.embeddings = bool(cfg.get("embeddings", True))
            await respond(send, 200, b'{"ok":true}', JSON)
            return
        if path == "/fake/stats" and method == "GET":
            stats = {
                "requests": dict(self.stats),
                "cancelled_at": self.cancelled_at,
                "max_active": self.max_active,
            }
            await respond(send, 200, msgspec.json.encode(stats), JSON)
            return
        await respond(send, 404, b'{"error":{"code":404,"message":"no such control"}}', JSON)

    async def _infer(self, path: str, body: bytes, receive: Receive, send: Send) -> None:
        if self.delay_ms and await self._generate_or_hang_up(receive, self.delay_ms / 1000.0):
            return
        if path == "/v1/embeddings" and not self.embeddings:
            await respond(
                send,
                501,
                b'{"error":{"code":501,"message":"This server does not support embeddings. '
                b'Start it with `--embeddings`","type":"not_supported_error"}}',
                JSON,
            )
            return
        if self.fail_count > 0:
            self.fail_count -= 1
            await respond(
                send,
                self.fail_status,
                msgspec.json.encode(
                    {
                        "error": {
                            "code": self.fail_status,
                            "message": self.fail_message,
                            "type": self.fail_type
                            or (
                                "server_error"
                                if self.fail_status >= 500
                                else "invalid_request_error"
                            ),
                        }
                    }
                ),
                JSON,
            )
            return
        try:
            req: dict[str, Any] = msgspec.json.decode(body)
        except msgspec.DecodeError:
            await respond(
                send,
                400,
                b'{"error":{"code":400,"message":"invalid JSON","type":"invalid_request_error"}}',
                JSON,
            )
            return
        if path == "/v1/embeddings":
            await respond(send, 200, self._embedding(req), JSON)
            return
        n = req.get("max_tokens") or req.get("max_completion_tokens") or self.tokens
        n = max(1, min(MAX_FAKE_TOKENS, int(n)))
        chat = path == "/v1/chat/completions"
        if req.get("stream") is True:
            await self._stream(send, chat, n)
            if self.close_after_stream:
                # uvicorn closes the connection when an app fails after its response:
                # keep-alive was announced, the connection still goes away.
                raise ConnectionAbortedError("fake: closing the connection after a stream")
        else:
            await respond(send, 200, self._complete(chat, n), JSON)

    async def _generate_or_hang_up(self, receive: Receive, seconds: float) -> bool:
        """'Generate' for ``seconds``; True (and the time recorded) if the caller left."""
        gone = False
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                nonlocal gone
                while (await receive())["type"] != "http.disconnect":
                    pass
                gone = True
                self.cancelled_at.append(time.time())
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            await anyio.sleep(seconds)
            tg.cancel_scope.cancel()
        return gone

    def _complete(self, chat: bool, n: int) -> bytes:
        text = " ".join(f"{self.word}{i}" for i in range(n))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return msgspec.json.encode(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "system_fingerprint": "fake",
                "choices": [choice],
                "usage": {"completion_tokens": n, "prompt_tokens": 4, "total_tokens": n + 4},
            }
        )

    async def _stream(self, send: Send, chat: bool, n: int) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        obj = "chat.completion.chunk" if chat else "text_completion"
        base = {
            "id": "chatcmpl-fake",
            "object": obj,
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": "fake",
        }

        async def event(doc: dict[str, Any]) -> None:
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + msgspec.json.encode(doc) + b"\n\n",
                    "more_body": True,
                }
            )

        for i in range(n):
            if self.token_delay_ms:
                await anyio.sleep(self.token_delay_ms / 1000.0)
            if chat:
                delta: dict[str, Any] = {"content": f"{self.word}{i} "}
                if i == 0:
                    delta["role"] = "assistant"
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
            else:
                choice = {"index": 0, "text": f"{self.word}{i} ", "finish_reason": None}
            await event({**base, "choices": [choice]})
        end: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            end["delta"] = {}
        else:
            end["text"] = ""
        await event({**base, "choices": [end]})
        await event(
            {
                **base,
                "choices": [],
                "usage": {"completion_tokens": n, "prompt_tokens": 4, "total_tokens": n + 4},
            }
        )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    def _embedding(self, req: dict[str, Any]) -> bytes:
        raw = req.get("input", "")
        items = raw if isinstance(raw, list) else [raw]
        data = [
            {"object": "embedding", "index": i, "embedding": [0.0, 0.5, 1.0]}
            for i in range(len(items))
        ]
        return msgspec.json.encode(
            {
                "object": "list",
                "data": data,
                "model": self.model,
                "usage": {"prompt_tokens": 4, "total_tokens": 4},
            }
        )


def main(argv: list[str] | None = None) -> None:
    """Serve the fake engine on loopback until SIGINT/SIGTERM."""
    import uvicorn

    from grid_server.serve import bind, url_of

    p = argparse.ArgumentParser(prog="grid-fake-engine")
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--api-key-file", type=Path, default=None)
    p.add_argument("--url-file", type=Path, default=None)
    args = p.parse_args(argv)
    key = args.api_key_file.read_text().strip() if args.api_key_file else None
    sock = bind(args.host, args.port)
    url = url_of(sock)
    if args.url_file:
        write_atomic(args.url_file, url, mode=URL_FILE_MODE)
    config = uvicorn.Config(
        FakeEngine(args.model, key), lifespan="on", access_log=False, log_level="warning"
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
