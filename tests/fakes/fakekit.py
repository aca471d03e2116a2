"""Shared parts of Grid's fake engines (tests only; never shipped, never a real engine).

The fakes exist because vLLM, Ollama and ComfyUI need GPUs this CPU-only test machine does
not have. Each fake is a separate executable speaking the real engine's HTTP routes, status
codes and start-up behaviour; this module holds what they share: deterministic token text,
OpenAI-shaped completion bodies and server-sent-event chunks, a real PNG encoder and a JSON
lines event log a test can read back.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

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
