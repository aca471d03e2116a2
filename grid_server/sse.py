"""Bounded, fragmentation-safe extraction of the completion-token count from responses.

Source: the specification's "Global placement loop" (server-owned measurements). Only the
``usage.completion_tokens`` number is kept; event payloads are scanned and discarded. Chunk
boundaries may fall anywhere (inside a line, inside ``\\r\\n``); oversized and malformed
events are skipped.
"""

from __future__ import annotations

import msgspec

MAX_EVENT_BYTES = 64 * 1024
"""Largest SSE event inspected; a usage event is well under 1 KiB, a huge one is skipped."""
MAX_JSON_BODY_BYTES = 4 * 1024 * 1024
"""Largest non-streaming body parsed for usage (embeddings of a big batch are skipped)."""
_MARK = b"completion_tokens"


class _Usage(msgspec.Struct):
    completion_tokens: int | None = None
    prompt_tokens: int | None = None


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None


_decoder = msgspec.json.Decoder(_WithUsage)


def usage_from_json(data: bytes) -> tuple[int | None, int | None]:
    """(completion_tokens, prompt_tokens) from one JSON document; (None, None) if absent."""
    if len(data) > MAX_JSON_BODY_BYTES:
        return None, None
    try:
        doc = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None, None
    if doc.usage is None:
        return None, None
    ct, pt = doc.usage.completion_tokens, doc.usage.prompt_tokens
    ct = ct if isinstance(ct, int) and 0 <= ct <= 10_000_000 else None
    pt = pt if isinstance(pt, int) and 0 <= pt <= 100_000_000 else None
    return ct, pt


class UsageScanner:
    """Feed raw SSE bytes in any fragmentation; read ``completion_tokens`` at the end.

    Memory is bounded by :data:`MAX_EVENT_BYTES`: an event that grows past it is dropped up
    to the next blank line.
    """

    __slots__ = ("_buf", "_skipping", "completion_tokens", "prompt_tokens")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skipping = False
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None

    def feed(self, chunk: bytes) -> None:
        """Consume one network chunk."""
        buf = self._buf
        buf += chunk.replace(b"\r", b"") if b"\r" in chunk else chunk
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                if len(buf) > MAX_EVENT_BYTES:
                    # Keep only a tail that may hold the start of the boundary.
                    self._skipping = True
                    del buf[:-1]
                return
            event = bytes(buf[:end])
            del buf[: end + 2]
            if self._skipping:
                self._skipping = False
                continue
            if _MARK in event:
                self._event(event)

    def _event(self, event: bytes) -> None:
        data = b"".join(
            line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
        )
        ct, pt = usage_from_json(data)
        if ct is not None:
            self.completion_tokens = ct
        if pt is not None:
            self.prompt_tokens = pt
