"""Evaluation-marked inference: only the operator capability may mark it, and it is never
demand (specification, "Proactive observation and portfolio planning": ordinary callers
cannot suppress their own demand signal)."""

from __future__ import annotations

from collections.abc import Callable

from server_testbed import Engine, Grid, serve_model

CHAT = {"messages": [{"role": "user", "content": "def add(a, b): return a + b  # review"}]}


def _rate(grid: Grid, model: str) -> float:
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    doc = grid.http.get(grid.url + "/allocator/status").json()
    return float(doc["controller"]["forecasts"][model]["request_rate_rps"])


def test_only_the_operator_marks_evaluations_and_they_are_not_demand(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    grid.http.put(
        grid.url + "/allocator/models/m-eval", headers=grid.operator(), json={"memory_mb": 100}
    ).raise_for_status()
    serve_model(grid, engines("m-eval"), "host-1")
    body = {"model": "m-eval", **CHAT}
    refused = grid.http.post(
        grid.url + "/v1/chat/completions", json=body, headers={"X-Grid-Evaluation": "1"}
    )
    assert refused.status_code == 403, refused.text
    assert "operator capability" in refused.json()["error"]["message"]
    for _ in range(3):
        marked = grid.http.post(
            grid.url + "/v1/chat/completions",
            json=body,
            headers={"X-Grid-Evaluation": "1", **grid.operator()},
        )
        assert marked.status_code == 200, marked.text
    assert _rate(grid, "m-eval") == 0.0  # evaluations (and the refused one) are no demand
    ordinary = grid.http.post(grid.url + "/v1/chat/completions", json=body)
    assert ordinary.status_code == 200
    assert _rate(grid, "m-eval") > 0.0
