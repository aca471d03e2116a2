"""Quality evaluations and learned lifecycle timings over real HTTP, across a server restart."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from server_testbed import Grid, host_with_cached_model

from grid_core.wire import CONTROL_HEADER, HeartbeatResponse, control_record_id, decode
from grid_server.harness import start_server

pytestmark = pytest.mark.integration

SHA = "d" * 64
OTHER = "e" * 64


@contextmanager
def restarted(grid: Grid) -> Iterator[Grid]:
    """Stop ``grid``'s server and start a new one on the same GRID_HOME (stopped after)."""
    assert grid.child is not None
    grid.child.stop()
    child = start_server(grid.home)
    again = Grid(child.url, grid.home, child=child)
    try:
        yield again
    finally:
        again.close()
        child.stop()


def controller_status(grid: Grid, detail: bool = False) -> dict[str, Any]:
    url = grid.url + "/allocator/status" + ("?detail=1" if detail else "")
    r = grid.http.get(url)
    r.raise_for_status()
    return r.json()["controller"]


def evaluate(grid: Grid, **body: object) -> httpx.Response:
    return grid.http.post(grid.url + "/allocator/evaluations", headers=grid.operator(), json=body)


def test_evaluations_are_recorded_refused_and_survive_a_restart(grid_process: Grid) -> None:
    grid = grid_process  # a restart is a process lifecycle
    http = grid.http
    http.put(
        grid.url + "/allocator/models/m-eval",
        headers=grid.operator(),
        json={"memory_mb": 1000, "artifact_sha256": SHA, "workload_scores": {"coding": 1.0}},
    ).raise_for_status()
    first = evaluate(grid, model_id="m-eval", workload="coding", score=0.8, latency_ms=120.0)
    assert first.status_code == 200, first.text
    assert first.json()["artifact_sha256"] == SHA
    assert first.json()["evidence"]["effective_samples"] == 1.0
    r = evaluate(grid, model_id="m-eval", workload="coding", score=0.6, artifact_sha256=SHA)
    assert r.status_code == 200, r.text

    wrong = evaluate(grid, model_id="m-eval", workload="coding", score=0.1, artifact_sha256=OTHER)
    assert wrong.status_code == 409
    assert "artifact_sha256" in wrong.json()["error"]["message"]
    missing = evaluate(grid, model_id="nobody", workload="coding", score=0.5)
    assert missing.status_code == 404
    assert evaluate(grid, model_id="m-eval", workload="coding", score=1.5).status_code == 400
    anonymous = http.post(
        grid.url + "/allocator/evaluations",
        json={"model_id": "m-eval", "workload": "coding", "score": 0.0},
    )
    assert anonymous.status_code == 401

    rows = controller_status(grid)["quality"]
    assert len(rows) == 1  # refused evaluations left nothing behind
    row = rows[0]
    assert (row["model_id"], row["workload"], row["artifact_sha256"]) == ("m-eval", "coding", SHA)
    assert row["effective_samples"] == pytest.approx(2.0, abs=1e-3)
    assert row["confidence"] == pytest.approx(0.25, abs=1e-3)
    assert row["score"] == pytest.approx(0.7)
    assert row["latency_ms"] == pytest.approx(120.0)
    assert row["age_s"] >= 0.0

    with restarted(grid) as again:
        after = controller_status(again)["quality"]
        assert len(after) == 1
        assert after[0]["score"] == pytest.approx(0.7)
        assert after[0]["effective_samples"] == pytest.approx(2.0, abs=1e-3)
        third = evaluate(again, model_id="m-eval", workload="coding", score=0.7)
        assert third.json()["evidence"]["effective_samples"] == pytest.approx(3.0, abs=1e-3)


def heartbeat(grid: Grid, token: str, host: str, **body: object) -> HeartbeatResponse:
    node = control_record_id(host)
    r = grid.http.post(
        f"{grid.url}/nodes/{node}/heartbeat",
        headers={CONTROL_HEADER: token},
        json={"node_id": node, **body},
    )
    assert r.status_code == 200, r.text
    return decode(r.content, HeartbeatResponse).document


def test_acknowledged_warm_duration_is_learned_and_persisted(grid_process: Grid) -> None:
    grid = grid_process  # a restart is a process lifecycle
    c, http = grid, grid.http
    token = host_with_cached_model(grid, "host-learn", "m-learn", SHA)
    http.put(
        grid.url + "/allocator/mode", headers=c.operator(), json={"mode": "automatic"}
    ).raise_for_status()
    http.post(grid.url + "/allocator/tick", headers=c.operator()).raise_for_status()
    resp = heartbeat(grid, token, "host-learn", request_commands=True)
    assert resp.allocator is not None
    warm = [cmd for cmd in resp.allocator.commands if cmd.kind == "warm"]
    assert warm, f"a warm of the cached weights was expected: {resp.allocator.commands}"
    ack = {"action_id": warm[0].action_id, "status": "succeeded", "duration_seconds": 12.5}
    heartbeat(grid, token, "host-learn", request_commands=False, acknowledgements=[ack])

    def learned(g: Grid) -> list[tuple[str, str, str | None, str, float, int]]:
        rows = controller_status(g, detail=True)["timings"]
        return [
            (
                r["host_id"],
                r["model_id"],
                r["artifact_sha256"],
                r["phase"],
                r["mean_s"],
                r["samples"],
            )
            for r in rows
        ]

    expected = [("host-learn", "m-learn", SHA, "warm", 12.5, 1)]
    assert learned(grid) == expected
    with restarted(grid) as again:
        assert learned(again) == expected
