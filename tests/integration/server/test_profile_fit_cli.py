"""``grid allocator model set`` against what the fleet has: a runtime nothing here provides (a
typo, or a plugin only on nodes not yet joined), a pin to a host that has not registered and
more required replicas than hosts that can run the model are accepted (exit 0: hosts and
plugins join later) with a warning naming the field on stderr, and status gives the reason;
explain names the runtime. A profile no registered host can run at all, or whose replica
is larger than every host that could run it, is said too."""

from __future__ import annotations

import pytest
from server_testbed import Grid
from test_server_cli import run

from grid_core.client import Calls
from grid_core.wire import control_record_id

pytestmark = pytest.mark.integration


@pytest.fixture
def grid(grid_process: Grid) -> Grid:
    """The CLI is a separate process: it needs the server listening on a real port."""
    return grid_process


def _register_llama_host(grid: Grid, host_id: str) -> None:
    body = {
        "role": "allocator",
        "host_id": host_id,
        "resources": {"capacity_mb": 32768, "runtimes": ["llama.cpp"]},
        "allocator": {
            "schema_version": 1,
            "state": "accepting",
            "actuator_capabilities": ["load", "warm", "drain", "unload"],
        },
    }
    grid.register(grid.node_token(host_id), control_record_id(host_id), body)


def _unmet(grid: Grid) -> str:
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator())
    return grid.http.get(grid.url + "/allocator/status").text


def test_unknown_runtime_is_accepted_with_a_warning_naming_the_field(grid: Grid) -> None:
    _register_llama_host(grid, "h1")
    r = run(grid, "allocator", "model", "set", "m", "--memory-mb", "100", "--runtime", "lama.cpp")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "grid: warning: runtimes: 'lama.cpp' is not provided by any plugin" in r.stderr
    assert "llama.cpp" in r.stderr.split("known:")[1]  # the known names are listed
    assert grid.client.send(Calls.get_model("m"))["profile"]["runtimes"] == ["lama.cpp"]


def test_pin_to_an_unregistered_host_is_accepted_with_a_warning(grid: Grid) -> None:
    _register_llama_host(grid, "h1")
    r = run(grid, "allocator", "model", "set", "p", "--memory-mb", "100", "--pin", "h9")
    assert r.returncode == 0, r.stderr
    assert "grid: warning: pins: host 'h9' is not registered" in r.stderr
    assert grid.client.send(Calls.get_model("p"))["profile"]["pins"] == ["h9"]
    assert "the host is not registered" in _unmet(grid)  # the reason, in status
    quiet = run(grid, "allocator", "model", "set", "q", "--memory-mb", "100", "--pin", "h1")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr


def test_more_required_replicas_than_able_hosts_is_accepted_with_a_warning(grid: Grid) -> None:
    _register_llama_host(grid, "h1")
    r = run(
        grid, "allocator", "model", "set", "r", "--memory-mb", "100",
        "--min-replicas", "2", "--max-replicas", "2",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "grid: warning: min_replicas: 2 required replica(s)" in r.stderr
    assert "1 registered host(s) can" in r.stderr
    assert "1 of 2 desired replica(s) unplaced" in _unmet(grid)


def test_explain_names_the_runtime_no_host_offers(grid: Grid) -> None:
    _register_llama_host(grid, "h1")
    r = run(
        grid, "allocator", "model", "set", "v", "--memory-mb", "100", "--runtime", "vllm",
        "--min-replicas", "1",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "min_replicas: 1 required replica(s)" in r.stderr and "vllm" in r.stderr
    _unmet(grid)
    explained = run(grid, "allocator", "explain", "v", "--json")
    assert explained.returncode == 0, explained.stderr
    assert "runtime vllm" in explained.stdout


def test_a_profile_no_registered_host_can_run_warns_without_min_replicas(grid: Grid) -> None:
    # The quickstart's case: a vLLM profile on a fleet that offers only llama.cpp.
    _register_llama_host(grid, "h1")
    r = run(grid, "allocator", "model", "set", "v0", "--memory-mb", "100", "--runtime", "vllm")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        "grid: warning: runtimes: none of the 1 registered host(s) can run it (they offer "
        "llama.cpp); a request for it fails with model_unplaceable until such a host joins or "
        "the profile changes"
    ]
    big = run(grid, "allocator", "model", "set", "big", "--memory-mb", "40000")
    assert big.returncode == 0, big.stderr
    assert "grid: warning: memory_mb: one replica needs 40000 MB" in big.stderr
