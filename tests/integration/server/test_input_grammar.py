"""One identifier grammar and a documented bound on every number, on every route.

Hand-crafted requests an operator (or a broken script) might send: each is refused with a
400 naming the field and the fix, and nothing is stored.
"""

from __future__ import annotations

import pytest
from server_testbed import Grid

from grid_core.client import RequestRefused
from grid_core.profile import MAX_REPLICA_CONCURRENCY
from grid_core.wire import CONTROL_HEADER, control_record_id

pytestmark = pytest.mark.integration

SHA = "a" * 64


def refused(r, field: str) -> None:  # type: ignore[no-untyped-def]  # an httpx.Response
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"], r.text


def test_identifier_grammar_on_profiles(grid: Grid) -> None:
    http, op = grid.http, grid.operator()
    for raw in ("a%00b", "a%0Ab", "a..b", "-lead", "a%20b"):
        refused(
            http.put(f"{grid.url}/allocator/models/{raw}", json={"memory_mb": 1}, headers=op),
            "model_id",
        )
    for field, value in [
        ("pins", ["host\nx"]),
        ("pins", [".."]),
        ("colocation_excludes", ["a//b"]),
        ("colocation_excludes", ["a/"]),
        ("required_tags", ["gpu\x00"]),
        ("data_tier", "tier 1"),
    ]:
        body = {"memory_mb": 1, "max_replicas": 2, field: value}
        refused(http.put(f"{grid.url}/allocator/models/m", json=body, headers=op), field)
    assert http.get(f"{grid.url}/allocator/status").json()["server"]["profiles"] == []


def test_numeric_bounds_sources_and_vocabulary(grid: Grid) -> None:
    http, op = grid.http, grid.operator()
    url = f"{grid.url}/allocator/models/m"
    cases = [
        ("replica_concurrency", {"replica_concurrency": 10_000_000_000_000_000_000}),
        ("replica_concurrency", {"replica_concurrency": MAX_REPLICA_CONCURRENCY + 1}),
        ("min_gpu_count", {"min_gpu_count": 2**63}),
        ("min_failure_domains", {"min_failure_domains": 10**6}),
        ("max_colocated_models", {"max_colocated_models": 10**9}),
        ("memory_mb", {"memory_mb": 2**63}),
        (
            "artifact_source",
            {
                "artifact_source": "hf://o/r/../../etc/x.gguf",
                "artifact_sha256": SHA,
                "artifact_size_mb": 10,
            },
        ),
        (
            "artifact_source",
            {
                "artifact_source": "hf://o/r/a%2F..%2Fb.gguf",
                "artifact_sha256": SHA,
                "artifact_size_mb": 10,
            },
        ),
        (
            "artifact_source",
            {
                "artifact_source": "hf://o/r/./x.gguf",
                "artifact_sha256": SHA,
                "artifact_size_mb": 10,
            },
        ),
        ("workload_scores", {"workload_scores": {"cooking": 1.0}}),
        ("priorty", {"priorty": 3}),
    ]
    for field, extra in cases:
        refused(http.put(url, json={"memory_mb": 100, **extra}, headers=op), field)
    ok = http.put(
        url,
        json={
            "memory_mb": 100,
            "replica_concurrency": MAX_REPLICA_CONCURRENCY,
            "artifact_source": "hf://owner/repo@main/dir/model-Q4_K_M.gguf",
            "artifact_sha256": SHA,
            "artifact_size_mb": 10,
        },
        headers=op,
    )
    assert ok.status_code == 200, ok.text


def test_host_ids_follow_the_same_grammar(grid: Grid) -> None:
    http, op = grid.http, grid.operator()
    for bad in ("a..b", "a\nb", "a/b", ""):
        r = http.post(f"{grid.url}/allocator/tokens", json={"host_id": bad}, headers=op)
        assert r.status_code == 400 and "$.host_id" in r.json()["error"]["message"], (bad, r.text)
    # A residency row whose model id breaks the grammar is dropped and fails the host closed.
    token = grid.node_token("host-g")
    grid.register_host(
        token,
        "host-g",
        residencies=[{"model_id": "m\nx", "memory_mb": 10, "state": "ready"}],
    )
    nodes = http.get(f"{grid.url}/nodes").json()["nodes"]
    ctl = next(n for n in nodes if n["node_id"] == control_record_id("host-g"))
    assert ctl["rejected_rows"] == 1
    r = http.put(
        f"{grid.url}/nodes/{control_record_id('host-g')}",
        json={"role": "allocator", "host_id": "host-g", "models": ["a..b"]},
        headers={CONTROL_HEADER: token},
    )
    assert r.status_code == 400 and "models" in r.json()["error"]["message"], r.text


def test_an_engine_route_can_never_point_at_the_grid_server(grid: Grid) -> None:
    token = grid.node_token("host-loop")
    port = grid.url.rsplit(":", 1)[1]
    for url in (grid.url, f"http://localhost:{port}", f"http://[::1]:{port}"):
        with pytest.raises(RequestRefused) as refused:
            grid.register_engine(token, "host-loop", "m", url, None)
        assert refused.value.status == 400 and "Grid server's own address" in refused.value.message
    assert grid.http.get(f"{grid.url}/nodes").json()["nodes"] == []
    # The node's own engine port is fine.
    grid.register_engine(token, "host-loop", "m", "http://127.0.0.1:9", None)
