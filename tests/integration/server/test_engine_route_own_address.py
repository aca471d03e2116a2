"""An engine route must be its node's own advertised address (issue 20).

A node credential may route the shared router only to its own machine: the engines of a node
that advertises an address must use exactly that address, a node that advertises none keeps
its engines on loopback, and no node may advertise another live node's address. Real HTTP to
a real server on loopback; the 198.18.0.0/15 addresses are only written into registrations,
never contacted.
"""

from __future__ import annotations

import pytest
from server_testbed import Grid

from grid_core.client import RequestRefused
from grid_core.wire import control_record_id, engine_record_id

pytestmark = pytest.mark.integration

MODEL = "m"


def advertise(grid: Grid, token: str, host_id: str, address: str | None) -> None:
    body: dict[str, object] = {
        "role": "allocator",
        "host_id": host_id,
        "resources": {"capacity_mb": 16384, "runtimes": ["llama.cpp"]},
    }
    if address is not None:
        body["advertise_host"] = address
    grid.register(token, control_record_id(host_id), body)


def engines(grid: Grid) -> dict[str, str]:
    nodes = grid.http.get(f"{grid.url}/nodes").json()["nodes"]
    return {n["host_id"]: n["url"] for n in nodes if n["role"] == "engine"}


def refused(grid: Grid, token: str, host_id: str, url: str, status: int, words: str) -> None:
    with pytest.raises(RequestRefused) as err:
        grid.register_engine(token, host_id, MODEL, url, None)
    assert err.value.status == status, err.value.message
    assert words in err.value.message, err.value.message


def test_an_engine_route_naming_another_hosts_address_is_refused(grid: Grid) -> None:
    a, b = grid.node_token("host-a"), grid.node_token("host-b")
    advertise(grid, a, "host-a", "198.18.7.2")
    advertise(grid, b, "host-b", "198.18.7.3")
    # host-a's credential cannot point the router at host-b's machine, nor at any other
    # address, nor at the server's own loopback.
    refused(grid, a, "host-a", "https://198.18.7.3:8443", 400, "advertised address '198.18.7.2'")
    refused(grid, a, "host-a", "https://198.18.9.9:8443", 400, "must point at its own node")
    refused(grid, a, "host-a", "http://127.0.0.1:9", 400, "advertised address")
    assert engines(grid) == {}
    # Its own address is accepted.
    grid.register_engine(a, "host-a", MODEL, "https://198.18.7.2:8443", None)
    assert engines(grid) == {"host-a": "https://198.18.7.2:8443"}


def test_a_node_that_advertises_nothing_keeps_its_engines_on_loopback(grid: Grid) -> None:
    token = grid.node_token("host-l")
    advertise(grid, token, "host-l", None)
    refused(grid, token, "host-l", "https://198.18.7.4:8443", 400, "--advertise-host")
    grid.register_engine(token, "host-l", MODEL, "http://127.0.0.1:9", None)
    grid.register_engine(token, "host-l", "n", "https://localhost:9443", None)
    nodes = grid.http.get(f"{grid.url}/nodes").json()["nodes"]
    assert {n["url"] for n in nodes if n["role"] == "engine"} == {
        "http://127.0.0.1:9",
        "https://localhost:9443",
    }


def test_a_remote_route_before_its_control_record_is_not_found(grid: Grid) -> None:
    # 404 makes a node agent re-register its control record (with its address) and retry.
    token = grid.node_token("host-n")
    refused(grid, token, "host-n", "https://198.18.7.5:8443", 404, "no control record")
    advertise(grid, token, "host-n", "198.18.7.5")
    grid.register_engine(token, "host-n", MODEL, "https://198.18.7.5:8443", None)
    assert engines(grid) == {"host-n": "https://198.18.7.5:8443"}


def test_no_node_may_advertise_another_live_nodes_address(grid: Grid) -> None:
    a, b = grid.node_token("host-a"), grid.node_token("host-b")
    advertise(grid, a, "host-a", "198.18.7.6")
    with pytest.raises(RequestRefused) as err:
        advertise(grid, b, "host-b", "198.18.7.6")
    assert err.value.status == 403 and "already advertised by host 'host-a'" in err.value.message
    # Loopback is shared by every node of one machine and never claimed.
    advertise(grid, a, "host-a", None)
    advertise(grid, b, "host-b", "127.0.0.1")
    advertise(grid, a, "host-a", "localhost")


def test_a_new_advertised_address_withdraws_routes_on_the_old_one(grid: Grid) -> None:
    token = grid.node_token("host-m")
    advertise(grid, token, "host-m", "198.18.7.7")
    grid.register_engine(token, "host-m", MODEL, "https://198.18.7.7:8443", None)
    before = grid.http.get(f"{grid.url}/nodes").json()["nodes"]
    assert engine_record_id("host-m", MODEL) in {n["node_id"] for n in before}
    advertise(grid, token, "host-m", "198.18.7.8")
    assert engines(grid) == {}
    ctl = next(
        n
        for n in grid.http.get(f"{grid.url}/nodes").json()["nodes"]
        if n["node_id"] == control_record_id("host-m")
    )
    assert ctl["advertise_host"] == "198.18.7.8"


def test_an_advertised_address_is_a_host_name_or_ip_only(grid: Grid) -> None:
    token = grid.node_token("host-g")
    for bad in ("https://198.18.7.9", "198.18.7.9:8443", "a b", "host/x", "", "user@host"):
        with pytest.raises(RequestRefused) as err:
            advertise(grid, token, "host-g", bad)
        assert err.value.status == 400 and "advertise_host" in err.value.message, bad
