"""Two real Grid server processes on one etcd (no node agents): election, follower refusals,
the follower's read-only view, a node heartbeat to a follower, and a clean handover."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from etcd_process import EtcdServer

from grid_core.client import Calls, RequestRefused
from grid_core.system import wait_until_sync
from grid_core.wire import Acknowledgement, Heartbeat
from grid_server.harness import Child, Testbed, start_server
from grid_server.home import OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE

WAIT_S = 60.0
"""Bound for one election or view refresh on a loaded machine (never a timing claim)."""
PROFILE = {"model_id": "m.gguf", "memory_mb": 64, "min_replicas": 1, "max_replicas": 1}


def wait_for(predicate: Any, what: str) -> Any:
    value = wait_until_sync(predicate, timeout_s=WAIT_S, interval_s=0.1)
    assert value, f"timed out waiting for {what}"
    return value


def store_status(url: str) -> dict[str, Any]:
    doc = httpx.get(f"{url}/allocator/status", timeout=10.0).json()
    return {"mode": doc["mode"], "profiles": doc["server"]["profiles"],
            **doc["server"]["state_store"]}  # fmt: skip


@pytest.fixture
def pair(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[dict[str, tuple[Child, Testbed]]]:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"controller_lease_s": 6.0}))
    args = ["--state-store", etcd_server.state_store, "--policy", str(policy)]
    started: dict[str, tuple[Child, Testbed]] = {}
    try:
        a = start_server(tmp_path / "a", tick_interval_s=1.0, extra_args=args)
        started["a"] = (a, Testbed(a.url, tmp_path / "a"))
        (tmp_path / "b").mkdir(mode=0o700)
        for name in (OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE):
            shutil.copy2(tmp_path / "a" / name, tmp_path / "b" / name)
        b = start_server(tmp_path / "b", tick_interval_s=1.0, extra_args=args)
        started["b"] = (b, Testbed(b.url, tmp_path / "b"))
        yield started
    finally:
        for child, bed in started.values():
            bed.close()
            child.stop()


def test_one_leader_followers_refuse_and_a_clean_stop_hands_over_at_once(
    pair: dict[str, tuple[Child, Testbed]],
) -> None:
    roles = wait_for(
        lambda: (
            (r := {n: store_status(c.url)["role"] for n, (c, _) in pair.items()})
            and sorted(r.values()) == ["follower", "leader"]
            and r
        ),
        "one leader and one follower",
    )
    leader = next(n for n, role in roles.items() if role == "leader")
    follower = next(n for n in pair if n != leader)
    (lead_child, lead), (_, follow) = pair[leader], pair[follower]

    # The follower refuses every operator change, naming the leader's URL and term.
    with pytest.raises(RequestRefused) as refused:
        follow.client.send(Calls.put_model("m.gguf", PROFILE))
    assert refused.value.status == 503 and lead_child.url in refused.value.message
    assert "term 1" in refused.value.message
    with pytest.raises(RequestRefused):
        follow.client.send(Calls.set_mode("automatic"))
    lead.client.send(Calls.put_model("m.gguf", PROFILE))
    lead.client.send(Calls.set_mode("automatic"))

    # A node heartbeat to the follower: registry truth, no commands, receipts left for the
    # leader (the answer says it follows).
    token = follow.node_token("host-x")
    follow.register_host(token, "host-x")
    hb = Heartbeat(
        node_id="ctl.host-x",
        host_id="host-x",
        request_commands=True,
        acknowledgements=[
            Acknowledgement(action_id="a1", status="succeeded", duration_seconds=1.0)
        ],
    )
    answer = follow.node(token).send(Calls.heartbeat("ctl.host-x", hb))
    assert answer.allocator is not None and answer.allocator.follower
    assert answer.allocator.commands == [] and answer.allocator.controller_lease_ttl_seconds == 0

    # The follower's read-only view catches up with the leader's document.
    wait_for(
        lambda: (
            (s := store_status(follow.url))["profiles"] == ["m.gguf"] and s["mode"] == "automatic"
        ),
        "the follower's view of the new profile and mode",
    )

    # A clean stop releases the lease: the follower takes over without waiting for it.
    lead_child.stop()
    t0 = time.monotonic()
    wait_for(lambda: store_status(follow.url)["role"] == "leader", "the handover")
    print(f"\nclean handover: {time.monotonic() - t0:.2f} s (lease 6 s)")
    after = store_status(follow.url)
    assert after["leader"]["term"] == 2
    assert after["profiles"] == ["m.gguf"] and after["mode"] == "automatic"
    follow.client.send(Calls.put_model("m.gguf", {**PROFILE, "max_replicas": 2}))


def test_requests_a_follower_answers_count_as_demand_on_the_leader(
    pair: dict[str, tuple[Child, Testbed]],
) -> None:
    """Clients may reach any server; only the leader plans. A model used only through a
    follower must not look idle to the leader (it would be scaled down)."""
    roles = wait_for(
        lambda: (
            (r := {n: store_status(c.url)["role"] for n, (c, _) in pair.items()})
            and sorted(r.values()) == ["follower", "leader"]
            and r
        ),
        "one leader and one follower",
    )
    leader = next(n for n, role in roles.items() if role == "leader")
    follower = next(n for n in pair if n != leader)
    (_, lead), (follow_child, _) = pair[leader], pair[follower]
    lead.client.send(Calls.put_model("m.gguf", {**PROFILE, "min_replicas": 0}))
    wait_for(lambda: store_status(follow_child.url)["profiles"] == ["m.gguf"], "the view")
    body = {"model": "m.gguf", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=follow_child.url, timeout=10.0) as client:
        for _ in range(6):
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 503, r.text  # no engine anywhere: cold-start advice

    def leader_rate() -> float:
        doc = httpx.get(f"{lead.url}/allocator/status?detail=1", timeout=10.0).json()
        forecast = doc["controller"]["forecasts"].get("m.gguf") or {}
        return float(forecast.get("request_rate_rps") or 0.0)

    wait_for(lambda: leader_rate() > 0, "the follower's requests in the leader's forecast")
    forwarding = wait_for(
        lambda: (f := store_status(follow_child.url)["forwarding"])["forwarded"] >= 6 and f,
        "the follower's forwarding counters",
    )
    assert forwarding["pending"] == 0 and forwarding["dropped"] == 0
    assert forwarding["error"] is None
    # Only the leader takes them: a follower refuses, so a sender keeps its queue.
    refused = httpx.post(
        f"{follow_child.url}/allocator/observations",
        json={"from_server": "x", "features": []},
        headers=pair[follower][1].operator(),
        timeout=10.0,
    )
    assert refused.status_code == 503, refused.text
