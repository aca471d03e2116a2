"""A runtime plugin's name is accepted in a profile over the HTTP API, placed only on nodes
that offer it, and reported unmet with the ``runtime`` reason while none does."""

from __future__ import annotations

import pytest
from server_testbed import Grid

from grid_core.wire import CONTROL_HEADER, control_record_id

pytestmark = pytest.mark.integration


def _node(grid: Grid, host_id: str, runtimes: list[str]) -> None:
    body = {
        "role": "allocator",
        "host_id": host_id,
        "resources": {"capacity_mb": 16384, "runtimes": runtimes, "max_models": 0},
        "allocator": {
            "schema_version": 1,
            "state": "accepting",
            "residencies": [],
            "actuator_capabilities": ["load", "warm", "drain", "unload"],
        },
    }
    grid.http.put(
        f"{grid.url}/nodes/{control_record_id(host_id)}",
        json=body,
        headers={CONTROL_HEADER: grid.node_token(host_id)},
    ).raise_for_status()


def _explain(grid: Grid, model_id: str) -> dict:
    grid.http.post(f"{grid.url}/allocator/tick", headers=grid.operator()).raise_for_status()
    r = grid.http.get(f"{grid.url}/allocator/explain/{model_id}", headers=grid.operator())
    r.raise_for_status()
    return dict(r.json())


def test_plugin_runtime_profile_is_unmet_until_a_node_offers_it(grid: Grid) -> None:
    put = grid.http.put(
        f"{grid.url}/allocator/models/echo-model",
        headers=grid.operator(),
        json={"memory_mb": 100, "min_replicas": 1, "runtimes": ["echo"]},
    )
    assert put.status_code == 200, put.text
    _node(grid, "host-a", ["llama.cpp"])
    doc = _explain(grid, "echo-model")
    assert doc["configured"] is True and doc["placed"] == 0
    assert doc["binding"] == "runtime"
    assert {v["host_id"]: v["reason"] for v in doc["hosts"]} == {"host-a": "runtime"}
    # A node that runs the echo adapter takes the replica; the llama.cpp-only node never does.
    _node(grid, "host-b", ["llama.cpp", "echo"])
    doc = _explain(grid, "echo-model")
    assert doc["placed"] == 1
    assert {v["host_id"]: v["verdict"] for v in doc["hosts"]}["host-b"] == "placed"


@pytest.mark.parametrize("bad", ["echo runtime", "echo/../x", "", "é" * 3])
def test_malformed_runtime_name_is_refused_naming_the_field(grid: Grid, bad: str) -> None:
    r = grid.http.put(
        f"{grid.url}/allocator/models/m.gguf",
        headers=grid.operator(),
        json={"memory_mb": 100, "runtimes": [bad]},
    )
    assert r.status_code == 400, r.text
    assert "runtimes" in r.json()["error"]["message"]
    assert (
        grid.http.get(f"{grid.url}/allocator/models/m.gguf", headers=grid.operator()).status_code
        == 404
    )
