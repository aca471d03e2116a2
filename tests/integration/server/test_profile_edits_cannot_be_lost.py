"""Profile edits that cannot be lost: every write names the version it read.

Two operators changing different fields of one profile at the same moment must never silently
undo one another: the second write either lands on top of the first (it read the new
version) or is refused with 409 showing both versions, and nothing is half-written.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from server_testbed import Grid
from test_server_cli import run

import grid_server.cli_allocator as cli_allocator
from grid_core.client import Call, Calls

pytestmark = pytest.mark.integration


def model_url(grid: Grid, model_id: str) -> str:
    return f"{grid.url}/allocator/models/{model_id}"


def test_interleaved_http_writes_both_survive_or_the_second_gets_409(grid: Grid) -> None:
    http, op = grid.http, grid.operator()
    r = http.put(model_url(grid, "m"), json={"memory_mb": 100}, headers=op)
    assert r.status_code == 200
    read = http.get(model_url(grid, "m"))
    etag = read.headers["etag"]
    assert etag == f'"{read.json()["version"]}"'
    base = read.json()["profile"]

    # Operator A raises the priority, operator B (who read the same version) the replicas.
    a = http.put(
        model_url(grid, "m"), json={**base, "priority": 5}, headers={**op, "If-Match": etag}
    )
    assert a.status_code == 200 and a.headers["etag"] != etag
    b = http.put(
        model_url(grid, "m"), json={**base, "max_replicas": 3}, headers={**op, "If-Match": etag}
    )
    assert b.status_code == 409
    err = b.json()["error"]
    assert "changed since it was read" in err["message"]
    details = err["details"]
    assert f'"{details["expected_version"]}"' == etag
    assert f'"{details["current_version"]}"' == a.headers["etag"]
    assert details["current"]["priority"] == 5 and details["proposed"]["max_replicas"] == 3
    # Nothing of B was written.
    assert http.get(model_url(grid, "m")).json()["profile"].get("max_replicas", 1) == 1

    # B re-reads and merges: both changes survive.
    fresh = http.get(model_url(grid, "m"))
    merged = {**fresh.json()["profile"], "max_replicas": 3}
    b2 = http.put(
        model_url(grid, "m"), json=merged, headers={**op, "If-Match": fresh.headers["etag"]}
    )
    assert b2.status_code == 200
    final = http.get(model_url(grid, "m")).json()["profile"]
    assert final["priority"] == 5 and final["max_replicas"] == 3


def test_create_only_and_bad_preconditions(grid: Grid) -> None:
    http, op = grid.http, grid.operator()
    create = {**op, "If-None-Match": "*"}
    assert http.put(model_url(grid, "c"), json={"memory_mb": 10}, headers=create).status_code == 200
    again = http.put(model_url(grid, "c"), json={"memory_mb": 20}, headers=create)
    assert (
        again.status_code == 409 and again.json()["error"]["details"]["current"]["memory_mb"] == 10
    )
    # Updating a profile that does not exist with a version is a conflict, not a create.
    ghost = http.put(
        model_url(grid, "ghost"), json={"memory_mb": 10}, headers={**op, "If-Match": '"abc"'}
    )
    assert ghost.status_code == 409 and ghost.json()["error"]["details"]["current"] is None
    weak = http.put(
        model_url(grid, "c"), json={"memory_mb": 10}, headers={**op, "If-Match": 'W/"x"'}
    )
    assert weak.status_code == 400 and "If-Match" in weak.json()["error"]["message"]
    assert http.get(model_url(grid, "ghost")).status_code == 404


@pytest.fixture
def grid_cli_home(grid_process: Grid) -> Iterator[Grid]:
    yield grid_process


def test_interleaved_model_set_second_gets_409_then_merges(
    grid_cli_home: Grid, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two real ``grid allocator model set`` runs interleave between read and write."""
    grid = grid_cli_home
    assert run(grid, "allocator", "model", "set", "m", "--memory-mb", "100").returncode == 0
    monkeypatch.setenv("GRID_HOME", str(grid.home))
    real_send = cli_allocator.send
    interleaved: list[subprocess.CompletedProcess[str]] = []

    def send_with_interleaving(g: str | None, call: Call[Any], **kw: Any) -> Any:
        # The first run's write waits until a second operator's run has completed.
        if call.method == "PUT" and not interleaved:
            interleaved.append(run(grid, "allocator", "model", "set", "m", "--max-replicas", "3"))
        return real_send(g, call, **kw)

    monkeypatch.setattr(cli_allocator, "send", send_with_interleaving)
    with pytest.raises(cli_allocator.CliError) as refused:
        cli_allocator.model_set(**_flags(grid, priority=7))
    assert interleaved[0].returncode == 0, interleaved[0].stderr
    text = str(refused.value)
    assert "nothing was written" in text and "server has:" in text
    assert "max_replicas: 3 → 1" in text  # the server's change is shown, not overwritten
    monkeypatch.setattr(cli_allocator, "send", real_send)
    # Re-running the refused command applies it on top of the other operator's change.
    assert run(grid, "allocator", "model", "set", "m", "--priority", "7").returncode == 0
    profile = grid.client.send(Calls.get_model("m"))["profile"]
    assert profile["priority"] == 7 and profile["max_replicas"] == 3


def test_every_list_field_can_be_cleared(grid_cli_home: Grid) -> None:
    grid = grid_cli_home
    r = run(
        grid,
        *("allocator", "model", "set", "m", "--memory-mb", "100", "--max-replicas", "2"),
        *("--pin", "h1", "--required-tag", "gpu", "--forbidden-tag", "laptop"),
        *("--backend", "cuda", "--colocation-exclude", "other", "--workload-score", "coding=1"),
        *("--runtime-memory-mb", "vllm=200", "--runtime", "vllm"),
    )
    assert r.returncode == 0, r.stderr
    r = run(
        grid,
        *("allocator", "model", "set", "m", "--clear-pins", "--clear-required-tags"),
        *("--clear-forbidden-tags", "--clear-backends", "--clear-colocation-excludes"),
        *("--clear-workload-scores", "--clear-runtime-memory-mb", "--clear-runtimes"),
    )
    assert r.returncode == 0, r.stderr
    assert "pins: h1 → -" in r.stdout
    profile = grid.client.send(Calls.get_model("m"))["profile"]
    for name in ("pins", "required_tags", "forbidden_tags", "backends", "colocation_excludes"):
        assert profile.get(name, []) == [], name
    assert profile.get("workload_scores", {}) == {} and profile.get("runtime_memory_mb", {}) == {}
    assert profile.get("runtimes", ["llama.cpp"]) == ["llama.cpp"]
    assert profile["max_replicas"] == 2  # untouched fields stay
    both = run(grid, "allocator", "model", "set", "m", "--pin", "h2", "--clear-pins")
    assert both.returncode == 2 and "--clear-pins" in both.stderr


def test_clear_returns_optional_fields_to_their_defaults_and_keeps_the_rest(
    grid_cli_home: Grid,
) -> None:
    grid = grid_cli_home
    r = run(
        grid,
        *("allocator", "model", "set", "m", "--memory-mb", "1000", "--max-replicas", "2"),
        *("--latency-slo-ms", "200", "--data-tier", "internal", "--priority", "4"),
        *("--artifact-source", "hf://owner/repo/tiny.gguf", "--artifact-sha256", "ab" * 32),
        *("--artifact-size-mb", "900", "--admission-headroom-mb", "700", "--pin", "h1"),
    )
    assert r.returncode == 0, r.stderr
    # Field names and flag spellings alike; every other field is kept.
    r = run(
        grid,
        *("allocator", "model", "set", "m", "--clear", "latency_slo_ms", "--clear=--data-tier"),
        *("--clear", "artifact-source", "--clear", "admission_headroom_mb"),
    )
    assert r.returncode == 0, r.stderr
    assert "latency_slo_ms: 200.0 → -" in r.stdout and "data_tier: internal → -" in r.stdout
    profile = grid.client.send(Calls.get_model("m"))["profile"]
    for name in ("latency_slo_ms", "data_tier", "artifact_source", "admission_headroom_mb"):
        assert profile.get(name) is None, name
    assert (profile["max_replicas"], profile["priority"], profile["memory_mb"]) == (2, 4, 1000)
    assert profile["pins"] == ["h1"] and profile["artifact_sha256"] == "ab" * 32


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--clear", "latency"), "--clear 'latency': no profile field of that name"),
        (("--clear", "memory_mb"), "memory_mb is required and has no default to return to"),
        (
            ("--clear", "priority", "--priority", "3"),
            "--clear priority and --priority were both given; use one of them",
        ),
    ],
)
def test_a_refused_clear_writes_nothing(
    grid_cli_home: Grid, args: tuple[str, ...], message: str
) -> None:
    grid = grid_cli_home
    base = ("allocator", "model", "set", "m")
    r = run(grid, *base, "--memory-mb", "1000", "--latency-slo-ms", "200", "--priority", "4")
    assert r.returncode == 0, r.stderr
    before = grid.client.send(Calls.get_model("m"))
    # The other flags of the refused command are not applied either.
    refused = run(grid, *base, "--max-replicas", "5", "--clear", "latency_slo_ms", *args)
    assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert grid.client.send(Calls.get_model("m")) == before


def _flags(grid: Grid, **given: object) -> dict[str, object]:
    """Every ``model_set`` parameter at its not-given value, plus ``given``."""
    import inspect

    out: dict[str, object] = {}
    for name, param in inspect.signature(cli_allocator.model_set).parameters.items():
        default = param.default
        value = getattr(default, "default", default)
        out[name] = list(value) if isinstance(value, list) else value
    out.update(model_id="m", grid=grid.url, token_file=None)
    out.update(given)
    return out
