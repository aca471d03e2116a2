"""The bounded SSE usage scanner survives any fragmentation and ignores junk."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from grid_server.sse import MAX_EVENT_BYTES, UsageScanner, usage_from_json


def stream(tokens: int, crlf: bool = False) -> bytes:
    nl = b"\r\n" if crlf else b"\n"
    events = [{"choices": [{"delta": {"content": f"t{i} "}}]} for i in range(5)]
    events.append({"choices": [], "usage": {"completion_tokens": tokens, "prompt_tokens": 3}})
    out = b"".join(b"data: " + json.dumps(e).encode() + nl + nl for e in events)
    return out + b"data: [DONE]" + nl + nl


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=20), crlf=st.booleans())
def test_any_fragmentation_yields_the_same_count(cuts: list[int], crlf: bool) -> None:
    data = stream(42, crlf)
    points = sorted({c % (len(data) + 1) for c in cuts})
    scanner = UsageScanner()
    prev = 0
    for p in [*points, len(data)]:
        scanner.feed(data[prev:p])
        prev = p
    assert scanner.completion_tokens == 42
    assert scanner.prompt_tokens == 3


def test_oversized_event_is_skipped_and_the_next_one_still_counts() -> None:
    scanner = UsageScanner()
    junk = b"data: " + b"x" * (MAX_EVENT_BYTES * 2) + b' "completion_tokens": 999\n\n'
    for i in range(0, len(junk), 4096):
        scanner.feed(junk[i : i + 4096])
    assert scanner.completion_tokens is None
    scanner.feed(b'data: {"usage": {"completion_tokens": 7}}\n\n')
    assert scanner.completion_tokens == 7
    assert len(scanner._buf) < MAX_EVENT_BYTES  # bounded memory


def test_malformed_or_wrong_typed_usage_is_ignored() -> None:
    scanner = UsageScanner()
    scanner.feed(b'data: {"usage": {"completion_tokens": "many"}}\n\n')
    scanner.feed(b'data: {"usage": {"completion_tokens": 5\n\n')
    scanner.feed(b'data: {"usage": {"completion_tokens": -5}}\n\n')
    assert scanner.completion_tokens is None


def test_non_streaming_body() -> None:
    assert usage_from_json(b'{"usage": {"completion_tokens": 9, "prompt_tokens": 2}}') == (9, 2)
    assert usage_from_json(b'{"usage": null}') == (None, None)
    assert usage_from_json(b"not json") == (None, None)
