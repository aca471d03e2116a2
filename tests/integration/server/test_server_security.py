"""Credentials at the HTTP boundary: refusals, host scope, expiry, and no secret leaks."""

from __future__ import annotations

import stat
import time
from collections.abc import Callable

import httpx
import pytest
from server_testbed import Engine, Grid, serve_model

from grid_core.client import RequestRefused
from grid_core.wire import CONTROL_HEADER, OPERATOR_HEADER, control_record_id, engine_record_id
from grid_server.home import OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE

pytestmark = pytest.mark.integration

MUTATIONS: list[tuple[str, str, object]] = [
    ("PUT", "/allocator/models/m-sec", {"memory_mb": 1000}),
    ("DELETE", "/allocator/models/m-sec", None),
    ("PUT", "/allocator/mode", {"mode": "observe"}),
    ("POST", "/allocator/tick", None),
    ("POST", "/allocator/evaluations", {"model_id": "m-sec", "workload": "coding", "score": 0.9}),
    ("POST", "/allocator/tokens", {"host_id": "evil"}),
]


def call(
    grid: Grid, method: str, path: str, body: object, headers: dict[str, str]
) -> httpx.Response:
    return grid.http.request(
        method, grid.url + path, headers=headers, json=body if body is not None else None
    )


@pytest.mark.parametrize(("method", "path", "body"), MUTATIONS)
def test_every_mutation_needs_the_operator_capability(
    grid: Grid, method: str, path: str, body: object
) -> None:
    good = grid.operator_token
    for headers in (
        {},
        {OPERATOR_HEADER: "wrong"},
        {"authorization": "Bearer wrong"},
        {OPERATOR_HEADER: good + "x"},
        {"authorization": good},
    ):
        r = call(grid, method, path, body, headers)
        assert r.status_code == 401, (headers, r.text)
        assert good not in r.text
    status = grid.http.get(grid.url + "/allocator/status").json()
    assert status["server"]["profiles"] == []
    assert status["mode"] == "recommend"


def test_bearer_form_of_the_operator_capability_works(grid: Grid) -> None:
    r = grid.http.put(
        grid.url + "/allocator/mode",
        json={"mode": "observe"},
        headers={"authorization": f"Bearer {grid.operator_token}"},
    )
    assert r.status_code == 200 and r.json()["mode"] == "observe"


def test_node_routes_need_a_credential(grid: Grid) -> None:
    http = grid.http
    body = {"role": "allocator", "host_id": "h1", "resources": {"capacity_mb": 1}}
    node = control_record_id("h1")
    assert http.put(f"{grid.url}/nodes/{node}", json=body).status_code == 401
    assert (
        http.put(
            f"{grid.url}/nodes/{node}", json=body, headers={CONTROL_HEADER: "garbage"}
        ).status_code
        == 401
    )
    hb = {"node_id": node}
    assert http.post(f"{grid.url}/nodes/{node}/heartbeat", json=hb).status_code == 401
    assert http.delete(f"{grid.url}/nodes/{node}").status_code == 401
    # The operator capability is not a node credential.
    assert (
        http.put(
            f"{grid.url}/nodes/{node}",
            json=body,
            headers={CONTROL_HEADER: grid.operator_token},
        ).status_code
        == 401
    )


def test_host_a_credential_is_refused_for_host_b(grid: Grid) -> None:
    http, c = grid.http, grid
    token_a = c.node_token("host-a")
    token_b = c.node_token("host-b")
    c.register_host(token_b, "host-b")
    # Squatting B's control record: body naming B, or body naming A at B's derived id.
    r = http.put(
        f"{grid.url}/nodes/{control_record_id('host-b')}",
        headers={CONTROL_HEADER: token_a},
        json={"role": "allocator", "host_id": "host-b"},
    )
    assert r.status_code == 403
    r = http.put(
        f"{grid.url}/nodes/{control_record_id('host-b')}",
        headers={CONTROL_HEADER: token_a},
        json={"role": "allocator", "host_id": "host-a"},
    )
    assert r.status_code == 403
    r = http.put(
        f"{grid.url}/nodes/{engine_record_id('host-b', 'm')}",
        headers={CONTROL_HEADER: token_a},
        json={"role": "engine", "host_id": "host-a", "models": ["m"], "url": "http://127.0.0.1:9"},
    )
    assert r.status_code == 403
    node_b = control_record_id("host-b")
    r = http.post(
        f"{grid.url}/nodes/{node_b}/heartbeat",
        headers={CONTROL_HEADER: token_a},
        json={"node_id": node_b},
    )
    assert r.status_code == 403
    assert (
        http.delete(f"{grid.url}/nodes/{node_b}", headers={CONTROL_HEADER: token_a}).status_code
        == 403
    )
    nodes = http.get(grid.url + "/nodes").json()["nodes"]
    assert [(n["node_id"], n["host_id"]) for n in nodes] == [(node_b, "host-b")]


def test_expired_node_credential_is_refused(grid: Grid) -> None:
    token = grid.node_token("host-x", ttl_s=1.0)
    assert grid.register_host(token, "host-x").host_id == "host-x"
    time.sleep(1.2)
    with pytest.raises(RequestRefused) as refused:
        grid.register_host(token, "host-x")
    assert refused.value.status == 401 and "expired" in refused.value.message


def test_plain_http_engine_off_loopback_is_refused(grid: Grid) -> None:
    token = grid.node_token("host-y")
    with pytest.raises(RequestRefused) as refused:
        grid.register_engine(token, "host-y", "m", "http://10.1.2.3:8080", "k")
    assert refused.value.status == 400


def test_no_secret_in_status_nodes_or_logs(
    grid_process: Grid, engines: Callable[[str], Engine]
) -> None:
    grid = grid_process  # the server's own log is part of what is checked
    eng = engines("m-secret")
    token = serve_model(grid, eng, "host-s")
    http = grid.http
    operator = grid.operator_token
    signing = (grid.home / SIGNING_KEY_FILE).read_text().strip()
    assert (
        http.post(
            grid.url + "/v1/chat/completions",
            json={"model": "m-secret", "messages": [{"role": "user", "content": "hi"}]},
        ).status_code
        == 200
    )
    http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    http.put(
        grid.url + "/allocator/mode",
        headers={OPERATOR_HEADER: "wrong-token"},
        json={"mode": "automatic"},
    )
    outputs = [
        http.get(grid.url + "/allocator/status").text,
        http.get(grid.url + "/allocator/status?detail=1").text,
        http.get(grid.url + "/nodes").text,
        http.get(grid.url + "/v1/models").text,
        grid.log_text(),
    ]
    for secret in (operator, signing, token, eng.key):
        for out in outputs:
            assert secret not in out
    nodes = http.get(grid.url + "/nodes").json()["nodes"]
    assert any(n["engine_key_registered"] for n in nodes)
    for name in (OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE):
        assert stat.S_IMODE((grid.home / name).stat().st_mode) == 0o600
