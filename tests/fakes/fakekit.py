"""Shared parts of Grid's fake engines (tests only; never shipped, never a real engine).

The fakes exist because vLLM, Ollama and ComfyUI need GPUs this CPU-only test machine does
not have. Each fake is a separate executable speaking the real engine's HTTP routes, status
codes and start-up behaviour; this module holds what they share: deterministic token text,
OpenAI-shaped completion bodies and server-sent-event chunks, a real PNG encoder, a JSON
lines event log a test can read back, the generation response (streamed or whole) and serving
an aiohttp application on a port a test can read back.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

from aiohttp import web

WORDS = ("grid", "fake", "token", "engine", "reply", "ok", "model", "ready")
"""Vocabulary of the fake text: deterministic, so tests can count tokens exactly."""


def token(i: int) -> str:
    """The ``i``-th generated token (a word followed by a space)."""
    return WORDS[i % len(WORDS)] + " "


def completion_body(
    model: str, text: str, prompt_tokens: int, completion_tokens: int, *, chat: bool
) -> dict[str, Any]:
    """An OpenAI chat.completion or text_completion body with usage."""
    now = int(time.time())
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if chat:
        return {
            "id": f"chatcmpl-{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": now,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
            ],
            "usage": usage,
        }
    return {
        "id": f"cmpl-{time.monotonic_ns()}",
        "object": "text_completion",
        "created": now,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
        "usage": usage,
    }


def chunk(model: str, piece: str, *, chat: bool, done: bool = False) -> bytes:
    """One server-sent event of a streamed completion."""
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": piece} if piece else {}}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": piece}
        obj = "text_completion"
    choice["finish_reason"] = "length" if done else None
    doc = {"id": "stream", "object": obj, "created": int(time.time()), "model": model}
    doc["choices"] = [choice]
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def prompt_tokens(body: dict[str, Any]) -> int:
    """Rough prompt size in tokens (4 characters per token, at least 1)."""
    text = json.dumps(body.get("messages") or body.get("prompt") or "")
    return max(1, len(text) // 4)


def png(width: int, height: int, seed: int) -> bytes:
    """A real RGB PNG (signature, IHDR, zlib IDAT, IEND with CRCs) coloured by ``seed``."""

    def block(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    r, g, b = (seed * 67) % 256, (seed * 131) % 256, (seed * 199) % 256
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter type: none
        shade = (y * 255) // max(1, height - 1)
        rows += bytes((r, g, (b + shade) % 256)) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + block(b"IHDR", header)
        + block(b"IDAT", zlib.compress(bytes(rows)))
        + block(b"IEND", b"")
    )


class EventLog:
    """Append-only JSON lines file of what a fake did (loads, unloads, requests)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def write(self, event: str, **fields: Any) -> None:
        """Append one event with a wall-clock timestamp (flushed, so a test sees it at once)."""
        if self.path is None:
            return
        line = json.dumps({"event": event, "at": time.time(), **fields})
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every event of a fake's log (empty when the fake logged nothing yet)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def behaviour(path: Path) -> dict[str, Any]:
    """Knobs a test sets for one fake model: ``fake-engine.json`` beside the weights.

    Keys (all optional): ``start_delay_s`` (slow start), ``crash_after_s`` (the process dies
    this long after it is ready), ``exit_at_start`` (fails to start with this message),
    ``token_delay_s`` (time per generated token).
    """
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


async def generation_response(
    request: web.Request,
    body: dict[str, Any],
    model: str,
    tokens: int,
    token_delay_s: float,
    *,
    chat: bool,
) -> web.StreamResponse:
    """An OpenAI completion of ``tokens`` fake tokens, ``token_delay_s`` apart.

    A ``stream`` request gets server-sent events ending in ``data: [DONE]``; any other gets
    one completion body with usage after the whole generation time.
    """
    if body.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(tokens):
            await asyncio.sleep(token_delay_s)
            await resp.write(chunk(model, token(i), chat=chat))
        await resp.write(chunk(model, "", chat=chat, done=True))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    await asyncio.sleep(token_delay_s * tokens)
    text = "".join(token(i) for i in range(tokens))
    return web.json_response(completion_body(model, text, prompt_tokens(body), tokens, chat=chat))


async def serve(app: web.Application, host: str, port: int, port_file: Path | None) -> int:
    """Serve ``app`` on ``host:port`` (0 = any free port); returns the bound port.

    When ``port_file`` is given the bound port is written there atomically (temp file, then
    rename), so a test that started the fake on port 0 reads a complete number.
    """
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]  # aiohttp API
    if port_file:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(bound))
        os.replace(tmp, port_file)
    return bound
