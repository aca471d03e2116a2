"""The JSON nesting bound: brackets inside strings do not count, deep bodies are refused."""

from __future__ import annotations

import pytest

from grid_core.wire import MAX_JSON_DEPTH, WireError, check_json_depth, json_depth


def nested(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def test_depth_counts_arrays_and_objects() -> None:
    doc = b'{"a": [' + b'{"b": ' * 70 + b"1" + b"}" * 70 + b"]}"
    assert json_depth(doc) == 72


def test_brackets_inside_strings_and_escaped_quotes_do_not_count() -> None:
    text = b"[{" * 200 + b'\\"' + b"[" * 200
    doc = b'{"messages": [{"content": "' + text + b'"}]}'
    assert json_depth(doc) == 3


def test_the_bound_itself_is_accepted_and_one_more_level_is_refused() -> None:
    check_json_depth(nested(MAX_JSON_DEPTH), "body")
    with pytest.raises(WireError, match=f"deeper than {MAX_JSON_DEPTH} levels"):
        check_json_depth(nested(MAX_JSON_DEPTH + 1), "body")


def test_ten_thousand_levels_are_refused_without_recursion() -> None:
    with pytest.raises(WireError, match="PUT /allocator/mode: JSON nests deeper"):
        check_json_depth(nested(10_000), "PUT /allocator/mode")
