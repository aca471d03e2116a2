"""Observation surfaces of a real server: /metrics, /schema, the dashboard, ``grid allocator
explain`` and the rich ``grid allocator status`` (FAKE engines stand in for llama-server)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import httpx
import pytest
from litestar.exceptions import LitestarDeprecationWarning
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families
from server_testbed import Engine, Grid, serve_model

from grid_core.system import wait_until_sync
from grid_core.testing import plugins_with
from grid_core.wire import CONTROL_HEADER, control_record_id
from grid_server.app import build_app

pytestmark = pytest.mark.integration


@pytest.fixture
def grid(grid_process: Grid) -> Grid:
    """These tests need the server listening on a real port (raw sockets, the CLI, or
    connection behaviour), so they use the server process."""
    return grid_process


GRID_BIN = Path(sys.executable).parent / "grid"
AFFINITY_KEYS = 1200
"""More distinct affinity keys than the 1,000 the cardinality bound is stated for."""
HISTORY_WAIT_S = 15.0
"""Seconds to wait for a history point after the traffic (points are at least 2 s apart)."""


def cli(grid: Grid, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GRID_BIN), *args, "--grid", grid.url],
        env={"GRID_HOME": str(grid.home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(samples: list, name: str, **labels: str) -> float:
    hits = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert hits, f"no sample {name} {labels}"
    return sum(hits)


# --- /metrics -------------------------------------------------------------------------------
def test_metrics_report_controller_router_and_nodes_with_bounded_labels(
    grid: Grid, engines
) -> None:
    engine: Engine = engines("tiny.gguf")
    serve_model(grid, engine, "host-a")
    grid.http.put(
        f"{grid.url}/allocator/models/tiny.gguf",
        headers=grid.operator(),
        json={"memory_mb": 1024, "min_replicas": 1},
    ).raise_for_status()
    grid.http.post(f"{grid.url}/allocator/tick", headers=grid.operator()).raise_for_status()
    grid.wait_ready("tiny.gguf")
    with httpx.Client(base_url=grid.url, timeout=30.0, trust_env=False) as http:
        for i in range(AFFINITY_KEYS):
            r = http.post(
                "/v1/chat/completions",
                json={
                    "model": "tiny.gguf",
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}],
                },
                headers={"x-grid-affinity-key": f"conversation-{i}"},
            )
            assert r.status_code == 200, r.text
        # A configured model with no engine: 503 with Retry-After.
        grid.http.put(
            f"{grid.url}/allocator/models/cold.gguf",
            headers=grid.operator(),
            json={"memory_mb": 1024},
        ).raise_for_status()
        cold = http.post("/v1/completions", json={"model": "cold.gguf", "prompt": "x"})
        assert cold.status_code == 503 and cold.headers["retry-after"]
        # Unknown names chosen by callers never become labels.
        for i in range(20):
            http.post("/v1/completions", json={"model": f"made-up-{i}", "prompt": "x"})
        text = http.get("/metrics").text

        # The history keeps at most one point per 2 s, so a pass right after the previous one
        # adds none: tick until a point carries the traffic above.
        def sampled() -> list[dict]:
            http.post(f"{grid.url}/allocator/tick", headers=grid.operator()).raise_for_status()
            points = http.get("/dashboard/history").json()["points"]
            models = points[-1]["models"] if points else {}
            return points if models.get("tiny.gguf", [0])[0] > 0 else []

        history = wait_until_sync(sampled, timeout_s=HISTORY_WAIT_S, interval_s=0.5)
        assert history, f"no history point with traffic within {HISTORY_WAIT_S} s"
    # The dashboard's charts: one point per pass (at most every 2 s), every configured model.
    last = history[-1]["models"]
    assert "tiny.gguf" in last
    rate, _concurrency, desired, ready = last["tiny.gguf"]
    assert rate > 0 and desired == 1 and ready == 1
    assert [p["t"] for p in history] == sorted(p["t"] for p in history)
    fam = families(text)
    # Router: every proxied request counted once, by model and outcome.
    req = fam["grid_router_requests"]
    assert value(req, "grid_router_requests_total", model="tiny.gguf", outcome="ok") == (
        AFFINITY_KEYS
    )
    assert value(req, "grid_router_requests_total", model="other") == 20
    assert (
        value(
            fam["grid_router_retry_after_responses"],
            "grid_router_retry_after_responses_total",
            model="cold.gguf",
        )
        == 1
    )
    added = fam["grid_router_added_latency_seconds"]
    assert value(added, "grid_router_added_latency_seconds_count", model="tiny.gguf") == (
        AFFINITY_KEYS
    )
    assert (
        0
        < value(added, "grid_router_added_latency_seconds_sum", model="tiny.gguf")
        < (AFFINITY_KEYS * 5.0)
    )
    up = fam["grid_router_upstream_latency_seconds"]
    assert value(up, "grid_router_upstream_latency_seconds_count", model="tiny.gguf") == (
        AFFINITY_KEYS
    )
    assert value(fam["grid_router_tokens"], "grid_router_tokens_total", kind="completion") > 0
    assert value(fam["grid_router_inflight_requests"], "grid_router_inflight_requests") == 0
    assert value(fam["grid_router_open_breakers"], "grid_router_open_breakers") == 0
    # Controller.
    assert value(fam["grid_controller_mode"], "grid_controller_mode", mode="recommend") == 1
    assert value(fam["grid_controller_mode"], "grid_controller_mode", mode="automatic") == 0
    assert value(fam["grid_controller_plan_generation"], "grid_controller_plan_generation") >= 1
    assert value(fam["grid_controller_passes"], "grid_controller_passes_total") >= 1
    ticks = fam["grid_controller_tick_duration_seconds"]
    assert value(ticks, "grid_controller_tick_duration_seconds_count") >= 1
    assert "grid_controller_term" in fam and "grid_controller_lease_remaining_seconds" in fam
    models = fam["grid_model_desired_replicas"]
    assert value(models, "grid_model_desired_replicas", model="tiny.gguf") == 1
    assert value(fam["grid_model_ready_replicas"], "grid_model_ready_replicas", model="tiny.gguf")
    assert "grid_model_unmet_replicas" in fam and "grid_controller_active_actions" in fam
    # Nodes.
    assert (
        0
        <= value(
            fam["grid_node_heartbeat_age_seconds"], "grid_node_heartbeat_age_seconds", host="host-a"
        )
        < 60
    )
    state = fam["grid_node_protection_state"]
    assert value(state, "grid_node_protection_state", host="host-a", state="accepting") == 1
    assert value(state, "grid_node_protection_state", host="host-a", state="paused") == 0
    mem = fam["grid_node_memory_bytes"]
    assert value(mem, "grid_node_memory_bytes", host="host-a", kind="capacity") == 16384 * 2**20
    res = fam["grid_node_residency_state"]
    assert value(res, "grid_node_residency_state", host="host-a", model="tiny.gguf") == 1
    # Bounded cardinality: no affinity key, no made-up model, few series overall.
    assert "conversation-" not in text and "made-up-" not in text
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) < 400, len(series)


# --- /schema --------------------------------------------------------------------------------
def _registered_routes(tmp_path: Path) -> set[tuple[str, str]]:
    """(path, method) of every route the server's Litestar app registers, outside /schema."""
    with warnings.catch_warnings():
        # Routes other helpers still declare in Litestar's older parameter style warn here.
        warnings.simplefilter("ignore", LitestarDeprecationWarning)
        app = build_app(tmp_path / "home", plugins_with(builtins=("grid_server",)))
    out = set()
    for route in app.litestar.routes:
        path = route.path_format
        if path.startswith("/schema"):
            continue
        for method in getattr(route, "methods", ()):
            if method in ("HEAD", "OPTIONS"):
                continue
            out.add((path, method.lower()))
    return out


def test_openapi_document_is_valid_3_1_and_covers_every_route(grid: Grid, tmp_path: Path):
    r = httpx.get(f"{grid.url}/schema/openapi.json", trust_env=False)
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    validate(doc)  # raises on any violation of the OpenAPI 3.1 schema
    routes = _registered_routes(tmp_path)
    assert len(routes) >= 15
    missing = {(p, m) for p, m in routes if m not in doc["paths"].get(p, {})}
    assert not missing, f"routes absent from /schema: {sorted(missing)}"
    # Writes that take no body: a tick, spending a join token (it travels in a header) and
    # revoking a host (the host id is in the path).
    bodiless = {
        ("/allocator/tick", "post"),
        ("/allocator/join", "post"),
        ("/allocator/hosts/{host_id}/revoke", "post"),
    }
    for path, method in routes:
        op = doc["paths"][path][method]
        where = f"{method.upper()} {path}"
        ok = [v for k, v in op.get("responses", {}).items() if k.startswith("2")]
        assert ok and ok[0].get("content"), f"{where} documents no response type"
        if method in ("put", "post") and (path, method) not in bodiless:
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            assert body.get("schema"), f"{where} documents no request type"
    # The node wire documents are described by their own schemas.
    schemas = doc["components"]["schemas"]
    assert {"NodeRegistration", "Heartbeat", "HeartbeatResponse"} <= set(schemas)
    # The proxy's routes are described as the OpenAI-compatible API they are.
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"):
        op = next(iter(doc["paths"][path].values()))
        assert op["tags"] == ["OpenAI-compatible"]
        assert "openai" in op["externalDocs"]["url"]
    assert httpx.get(f"{grid.url}/schema", trust_env=False).json()["openapi"] == doc["openapi"]


# --- dashboard ------------------------------------------------------------------------------
def test_dashboard_files_are_served_without_any_external_reference(grid: Grid):
    with httpx.Client(base_url=grid.url, trust_env=False) as http:
        page = http.get("/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        for name in ("dashboard.js", "dashboard.css"):
            r = http.get(f"/dashboard/{name}")
            assert r.status_code == 200 and r.text
            assert "http://" not in r.text.replace("http://www.w3.org/2000/svg", "")
            assert "https://" not in r.text
        assert http.get("/dashboard/../../etc/passwd").status_code == 404
        assert http.get("/dashboard/secret.txt").status_code == 404
        hist = http.get("/dashboard/history").json()
        assert isinstance(hist["points"], list)


# --- grid allocator explain -----------------------------------------------------------------
def _host(
    grid: Grid, host_id: str, capacity_mb: int, *, state="accepting", max_models=0, res=()
) -> None:
    token = grid.node_token(host_id)
    body = {
        "role": "allocator",
        "host_id": host_id,
        "resources": {
            "capacity_mb": capacity_mb,
            "runtimes": ["llama.cpp"],
            "max_models": max_models,
        },
        "allocator": {
            "schema_version": 1,
            "state": state,
            "residencies": [
                {"model_id": m, "memory_mb": mb, "state": "ready", "active_requests": 0}
                for m, mb in res
            ],
            "actuator_capabilities": ["load", "warm", "drain", "unload"],
        },
    }
    grid.http.put(
        f"{grid.url}/nodes/{control_record_id(host_id)}",
        json=body,
        headers={CONTROL_HEADER: token},
    ).raise_for_status()


def _profile(grid: Grid, model_id: str, **fields: object) -> None:
    grid.http.put(
        f"{grid.url}/allocator/models/{model_id}", headers=grid.operator(), json=fields
    ).raise_for_status()


def _explained(grid: Grid, model_id: str) -> tuple[dict, str]:
    grid.http.post(f"{grid.url}/allocator/tick", headers=grid.operator()).raise_for_status()
    as_json = cli(grid, "allocator", "explain", model_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    text = cli(grid, "allocator", "explain", model_id)
    assert text.returncode == 0, text.stderr
    return json.loads(as_json.stdout), text.stdout


def test_explain_names_slots_when_model_slots_are_full(grid: Grid):
    _profile(grid, "busy.gguf", memory_mb=1024, min_replicas=1)
    _profile(grid, "cold.gguf", memory_mb=1024, min_replicas=1)
    _host(grid, "host-a", 16384, max_models=1, res=[("busy.gguf", 1024)])
    doc, text = _explained(grid, "cold.gguf")
    assert doc["binding"] == "slots"
    assert "binding constraint: slots" in text
    assert "host-a" in text and "model slot(s) are taken" in text


def test_explain_names_memory_when_no_host_has_room(grid: Grid):
    _profile(grid, "big.gguf", memory_mb=12288, min_replicas=1)
    _host(grid, "host-a", 8192)
    _host(grid, "host-b", 10240)
    doc, text = _explained(grid, "big.gguf")
    assert doc["binding"] == "memory"
    assert {v["reason"] for v in doc["hosts"]} == {"memory"}
    assert "binding constraint: memory" in text and "needs 12288 MB" in text


def test_explain_names_the_pin_when_the_pinned_host_is_full(grid: Grid):
    _profile(grid, "resident.gguf", memory_mb=10240, min_replicas=1, priority=5)
    _profile(grid, "pinned.gguf", memory_mb=10240, min_replicas=1, pins=["host-a"])
    _host(grid, "host-a", 16384, res=[("resident.gguf", 10240)])
    _host(grid, "host-b", 65536)
    doc, text = _explained(grid, "pinned.gguf")
    assert doc["binding"] == "pin"
    assert "binding constraint: pin" in text and "pinned to 'host-a'" in text
    verdicts = {v["host_id"]: v["verdict"] for v in doc["hosts"]}
    # A pin is a floor: demand is served on host-b, the pinned host lacks memory.
    assert verdicts == {"host-a": "rejected", "host-b": "placed"}
    assert "its pinned host" in text


def test_explain_names_protection_when_every_host_is_paused(grid: Grid):
    _profile(grid, "m.gguf", memory_mb=1024, min_replicas=1)
    _host(grid, "host-a", 16384, state="paused")
    _host(grid, "host-b", 16384, state="draining")
    doc, text = _explained(grid, "m.gguf")
    assert doc["binding"] == "protection"
    assert "binding constraint: protection" in text
    assert "protection state is 'paused'" in text and "'draining'" in text


def test_explain_of_an_unknown_model_says_how_to_configure_it_and_exits_2(grid: Grid):
    grid.http.post(f"{grid.url}/allocator/tick", headers=grid.operator()).raise_for_status()
    as_json = cli(grid, "allocator", "explain", "nothing.gguf", "--json")
    text = cli(grid, "allocator", "explain", "nothing.gguf")
    # Naming a model Grid does not know is operator input: exit 2, like any unknown model.
    assert (as_json.returncode, text.returncode) == (2, 2), (as_json.stderr, text.stderr)
    assert json.loads(as_json.stdout)["configured"] is False
    assert "grid allocator model set" in text.stdout
    assert text.stderr.startswith("grid: error:") and "has no profile" in text.stderr


# --- grid allocator status ------------------------------------------------------------------
def test_status_renders_hosts_models_actions_and_unmet_tables(grid: Grid):
    _profile(grid, "busy.gguf", memory_mb=1024, min_replicas=1)
    _profile(grid, "cold.gguf", memory_mb=1024, min_replicas=1)
    _host(grid, "host-a", 16384, max_models=1, res=[("busy.gguf", 1024)])
    grid.http.post(f"{grid.url}/allocator/tick", headers=grid.operator()).raise_for_status()
    out = cli(grid, "allocator", "status")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for title in ("Hosts", "Models", "Unmet", "Node records"):
        assert title in text
    assert "\x1b[" not in text, "a pipe gets no colour codes"
    assert "busy.gguf:ready" in text and "slot_limit" in text and "cold.gguf" in text
    as_json = json.loads(cli(grid, "allocator", "status", "--json").stdout)
    assert set(as_json) == {"mode", "controller", "server"}
