"""Registration, heartbeats and command delivery against the real controller."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from server_testbed import Engine, Grid, host_with_cached_model, serve_model

from grid_core.client import RequestRefused
from grid_core.wire import CONTROL_HEADER, HeartbeatResponse, control_record_id, decode
from grid_server.harness import server_url, start_server

pytestmark = pytest.mark.integration

SHA = "c" * 64


def heartbeat(grid: Grid, token: str, host: str, **body: object) -> HeartbeatResponse:
    node = control_record_id(host)
    r = grid.http.post(
        f"{grid.url}/nodes/{node}/heartbeat",
        headers={CONTROL_HEADER: token},
        json={"node_id": node, **body},
    )
    assert r.status_code == 200, r.text
    return decode(r.content, HeartbeatResponse).document


def test_heartbeat_response_follows_the_wire_contract(grid: Grid) -> None:
    token = grid.node_token("host-1")
    grid.register_host(token, "host-1")
    resp = heartbeat(
        grid, token, "host-1", load={"active_tasks": 1, "queue_depth": 0}, request_commands=False
    )
    assert resp.ttl_seconds == 60.0
    assert resp.allocator is not None and resp.allocator.mode == "recommend"
    assert resp.allocator.commands == []


def test_heartbeat_for_an_unregistered_record_is_404(grid: Grid) -> None:
    token = grid.node_token("host-2")
    node = control_record_id("host-2")
    r = grid.http.post(
        f"{grid.url}/nodes/{node}/heartbeat",
        headers={CONTROL_HEADER: token},
        json={"node_id": node},
    )
    assert r.status_code == 404


def test_malformed_residency_rows_are_reported_and_fail_closed(grid: Grid) -> None:
    token = grid.node_token("host-3")
    r = grid.register_host(
        token,
        "host-3",
        residencies=[
            {"model_id": "ok", "memory_mb": 10, "state": "ready"},
            {"model_id": "bad", "memory_mb": -5, "state": "ready"},
        ],
    )
    assert len(r.rejected_rows) == 1
    nodes = grid.http.get(grid.url + "/nodes").json()["nodes"]
    assert nodes[0]["rejected_rows"] == 1
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    status = grid.http.get(grid.url + "/allocator/status?detail=1").json()
    hosts = status["controller"]["hosts"]
    assert [h["healthy"] for h in hosts if h["host_id"] == "host-3"] == [False]


def test_invalid_lifecycle_state_is_refused_whole(grid: Grid) -> None:
    token = grid.node_token("host-4")
    with pytest.raises(RequestRefused) as refused:
        grid.register_host(token, "host-4", state="sleeping")
    assert refused.value.status == 400 and "state" in refused.value.message
    assert grid.http.get(grid.url + "/nodes").json()["nodes"] == []


def test_automatic_mode_delivers_a_command_once_marked(grid: Grid) -> None:
    c, http = grid, grid.http
    token = host_with_cached_model(grid, "host-5", "m-auto", SHA)
    r = http.put(grid.url + "/allocator/mode", headers=c.operator(), json={"mode": "automatic"})
    assert r.status_code == 200 and r.json()["mode"] == "automatic"
    http.post(grid.url + "/allocator/tick", headers=c.operator()).raise_for_status()
    early = heartbeat(grid, token, "host-5", request_commands=False)
    assert early.allocator is not None and early.allocator.commands == []
    before = http.get(grid.url + "/allocator/status?detail=1").json()["controller"]
    assert before["pending_commands"], "the plan must have work pending for this host"
    assert before["delivered_pending"] == []  # the early heartbeat marked nothing delivered
    resp = heartbeat(grid, token, "host-5", request_commands=True)
    assert resp.allocator is not None and resp.allocator.mode == "automatic"
    kinds = [(cmd.kind, cmd.model_id) for cmd in resp.allocator.commands]
    assert kinds and kinds[0][1] == "m-auto"
    assert resp.allocator.controller_lease_ttl_seconds > 0
    status = http.get(grid.url + "/allocator/status?detail=1").json()["controller"]
    delivered = {a["action_id"] if isinstance(a, dict) else a for a in status["delivered_pending"]}
    assert resp.allocator.commands[0].action_id in delivered


def test_delete_removes_the_record(grid: Grid) -> None:
    token = grid.node_token("host-6")
    grid.register_host(token, "host-6")
    node = control_record_id("host-6")
    r = grid.http.delete(f"{grid.url}/nodes/{node}", headers={CONTROL_HEADER: token})
    assert r.status_code == 200
    assert grid.http.get(grid.url + "/nodes").json()["nodes"] == []


def test_graceful_stop_removes_the_server_record(tmp_path: Path) -> None:
    home = tmp_path / "home"
    child = start_server(home)
    try:
        assert server_url(home) == child.url
    finally:
        child.stop()
    assert child.stopped == "terminated"  # SIGTERM was enough: a graceful stop
    assert server_url(home) is None
    assert not (home / "server.json").exists()


def test_invalid_report_from_a_known_host_fails_it_closed(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("m-fc")
    token = serve_model(grid, eng, "host-fc")
    http = grid.http
    assert (
        http.post(
            grid.url + "/v1/chat/completions",
            json={"model": "m-fc", "messages": [{"role": "user", "content": "x"}]},
        ).status_code
        == 200
    )
    node = control_record_id("host-fc")
    r = http.post(
        f"{grid.url}/nodes/{node}/heartbeat",
        headers={CONTROL_HEADER: token},
        json={"node_id": node, "allocator": {"state": "sleeping"}},
    )
    assert r.status_code == 400
    assert (
        http.post(
            grid.url + "/v1/chat/completions",
            json={"model": "m-fc", "messages": [{"role": "user", "content": "x"}]},
        ).status_code
        == 503
    )
    assert eng.requests() == 1
    # A valid report restores service.
    grid.register_host(
        token, "host-fc", residencies=[{"model_id": "m-fc", "memory_mb": 1024, "state": "ready"}]
    )
    assert (
        http.post(
            grid.url + "/v1/chat/completions",
            json={"model": "m-fc", "messages": [{"role": "user", "content": "x"}]},
        ).status_code
        == 200
    )
