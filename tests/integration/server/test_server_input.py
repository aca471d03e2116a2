"""What the control routes accept: typed bodies, guards, size and nesting bounds.

Each refusal is the one JSON error shape an operator sees, naming the field or the bound.
"""

from __future__ import annotations

import pytest
from server_testbed import Grid

from grid_core.wire import CONTROL_HEADER, MAX_JSON_DEPTH, control_record_id
from grid_server.http import MAX_CONTROL_BODY_BYTES

pytestmark = pytest.mark.integration

DEEP = b"[" * 10_000 + b"]" * 10_000
"""A 10,000-level nested body: once a 500 from a RecursionError on every JSON route."""


def message(r) -> str:  # type: ignore[no-untyped-def]  # an httpx.Response
    return str(r.json()["error"]["message"])


def test_deeply_nested_json_is_a_400_on_every_route(grid: Grid) -> None:
    token = grid.node_token("host-deep")
    node = control_record_id("host-deep")
    for method, path, headers in [
        ("POST", "/v1/chat/completions", {}),
        ("POST", "/allocator/tokens", grid.operator()),
        ("PUT", "/allocator/models/m", grid.operator()),
        ("PUT", "/allocator/mode", grid.operator()),
        ("POST", "/allocator/evaluations", grid.operator()),
        ("PUT", f"/nodes/{node}", {CONTROL_HEADER: token}),
        ("POST", f"/nodes/{node}/heartbeat", {CONTROL_HEADER: token}),
    ]:
        r = grid.http.request(method, grid.url + path, content=DEEP, headers=headers)
        assert r.status_code == 400, (path, r.text)
        assert f"deeper than {MAX_JSON_DEPTH} levels" in message(r), path


def test_operator_bodies_refuse_unknown_fields_and_empty_bodies(grid: Grid) -> None:
    http, op = grid.http, grid.operator()
    r = http.post(grid.url + "/allocator/tokens", json={"host_id": "h1", "tll_s": 60}, headers=op)
    assert r.status_code == 400 and "unknown field `tll_s`" in message(r)
    r = http.post(grid.url + "/allocator/tokens", content=b"", headers=op)
    assert r.status_code == 400 and "body is required" in message(r)
    r = http.put(grid.url + "/allocator/mode", json={"mode": "fast"}, headers=op)
    assert r.status_code == 400 and "`$.mode`" in message(r)
    r = http.post(
        grid.url + "/allocator/evaluations",
        json={"model_id": "m", "workload": "coding", "score": 1.5},
        headers=op,
    )
    assert r.status_code == 400 and "`$.score`" in message(r)
    r = http.post(grid.url + "/allocator/tokens", json={"ttl_s": True}, headers=op)
    assert r.status_code == 400 and "`$.ttl_s`" in message(r)
    assert r.json()["error"]["type"] == "ValidationError"


def test_the_guard_refuses_before_the_body_is_read(grid: Grid) -> None:
    big = b"x" * (MAX_CONTROL_BODY_BYTES + 1)
    r = grid.http.put(grid.url + "/allocator/mode", content=big)
    assert r.status_code == 401
    r = grid.http.put(grid.url + "/allocator/mode", content=big, headers=grid.operator())
    assert r.status_code == 413
    assert message(r) == f"PUT /allocator/mode: request body exceeds {MAX_CONTROL_BODY_BYTES} bytes"


def test_typed_client_round_trip(grid: Grid) -> None:
    credential = grid.client.issue_node_credential("host-typed", 120.0)
    assert credential.host_id == "host-typed" and credential.token
    registered = grid.register_host(credential.token, "host-typed")
    assert registered.node_id == control_record_id("host-typed") and registered.role == "allocator"
    assert grid.client.set_mode("observe")["mode"] == "observe"
