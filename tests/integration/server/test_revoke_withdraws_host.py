"""Revoking a host stops traffic to it the moment the command returns.

A real server process, real FAKE engines (``grid_server.fake_engine``) and, in front of each,
the real node-side keeper ``grid join --at`` starts: a detached process that holds the host's
control record and engine route with its own host-scoped credential and refreshes them every
few seconds. Which engine served a request is read from the fake engines' own counters. A
second test runs a real node agent (``start_node``, as ``grid allocator node start`` does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from grid_core.nodeconfig import NodeConfig
from grid_core.system import wait_until_sync
from grid_core.wire import CONTROL_HEADER, control_record_id
from grid_node.launch import agent_record, agent_running, start_node, stop_node
from grid_server.harness import Child, Testbed, start_fake_engine, start_server

pytestmark = pytest.mark.integration

MODEL = "m-shared"
WAIT_S = 60.0
"""Upper bound for a keeper to register on a busy machine (never asserted as a time)."""
AFFINITY_PROBES = 32
"""Session keys tried to find one the router sends to the engine to revoke: each goes to
either idle engine by rendezvous hashing, so 32 all missing it would be a routing fault."""
AFTER_REVOKE_REQUESTS = 4
"""Requests sent right after the revocation: with both engines routed before, any of them
could have gone to the revoked one."""


def grid(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@dataclass
class Engine:
    child: Child
    key: str
    name: str

    @property
    def host_id(self) -> str:
        return f"external-{self.name}"

    def served(self) -> int:
        r = httpx.get(
            f"{self.child.url}/fake/stats",
            headers={"Authorization": f"Bearer {self.key}"},
            trust_env=False,
        )
        return int(r.json()["requests"].get("/v1/chat/completions", 0))


@dataclass
class Lab:
    home: Path
    server: Child
    bed: Testbed
    tmp: Path
    engines: list[Child]

    def join(self, name: str) -> Engine:
        child, key = start_fake_engine(self.tmp, MODEL)
        self.engines.append(child)
        key_file = self.tmp / f"{name}.key"
        key_file.write_text(key + "\n")
        r = grid(
            self.home, "join", "--at", child.url, "-m", MODEL, "--name", name,
            "--api-key-file", str(key_file), "--grid", self.server.url,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr + r.stdout
        engine = Engine(child, key, name)
        assert wait_until_sync(
            lambda: engine.host_id in self.routed_hosts(), timeout_s=WAIT_S, interval_s=0.1
        )
        return engine

    def routed_hosts(self) -> set[str]:
        nodes = self.bed.http.get(f"{self.server.url}/nodes").json()["nodes"]
        return {n["host_id"] for n in nodes if n["role"] == "engine"}

    def chat(self, affinity: str | None = None) -> httpx.Response:
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"x-grid-affinity-key": affinity} if affinity else {}
        return self.bed.http.post(
            f"{self.server.url}/v1/chat/completions", json=body, headers=headers
        )

    def key_routed_to(self, engine: Engine) -> str | None:
        """An affinity key the router sends to ``engine`` now (both engines are idle, so
        each key goes to one of them by rendezvous hashing)."""
        for i in range(AFFINITY_PROBES):
            before = engine.served()
            key = f"session-{i}"
            assert self.chat(key).status_code == 200
            if engine.served() > before:
                return key
        return None

    def status(self) -> dict:
        return self.bed.client.status()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    home = tmp_path / "home"
    server = start_server(home, tick_interval_s=0.5)
    bed = Testbed(server.url, home)
    lab = Lab(home, server, bed, tmp_path, [])
    try:
        yield lab
    finally:
        for path in sorted((home / "external").glob("*.keeper.json")):
            grid(home, "join", "--remove", path.name.removesuffix(".keeper.json"))
        for child in lab.engines:
            child.stop()
        bed.close()
        server.stop()


def test_revoke_withdraws_the_host_at_once_and_a_new_credential_restores_it(lab: Lab) -> None:
    ops = lab.bed.operator()
    profile = {"model_id": MODEL, "memory_mb": 1024, "runtimes": ["openai"]}
    put = lab.bed.http.put(f"{lab.server.url}/allocator/models/{MODEL}", headers=ops, json=profile)
    assert put.status_code == 200, put.text
    bad, good = lab.join("bad"), lab.join("good")
    key = lab.key_routed_to(bad)
    assert key is not None, "no affinity key reached the engine to revoke"
    # Before the revocation this session's requests are served by the revoked host.
    before = bad.served()
    assert lab.chat(key).status_code == 200 and bad.served() == before + 1
    served_bad, served_good = bad.served(), good.served()

    r = grid(lab.home, "allocator", "node", "revoke", bad.host_id, "--json")
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert [e["models"] for e in answer["engines"]] == [[MODEL]]
    assert answer["models"] == [MODEL] and answer["no_ready_replica"] == []
    assert answer["control_record"] is True
    # Right after the command returned, well inside the revoked host's lease.
    for _ in range(AFTER_REVOKE_REQUESTS):
        assert lab.chat(key).status_code == 200
    assert bad.served() == served_bad
    assert good.served() == served_good + AFTER_REVOKE_REQUESTS
    assert lab.routed_hosts() == {good.host_id}

    status = lab.status()
    (row,) = status["server"]["revoked_hosts"]
    assert row["host_id"] == bad.host_id and row["state"] == "withdrawn" and row["reason"]
    assert bad.host_id not in {n["host_id"] for n in status["server"]["nodes"]}

    def controller_dropped_it() -> bool:
        hosts = lab.status()["controller"].get("hosts") or []
        ids = {h["host_id"] for h in hosts}
        return good.host_id in ids and bad.host_id not in ids

    assert wait_until_sync(controller_dropped_it, timeout_s=WAIT_S, interval_s=0.2)
    shown = grid(lab.home, "allocator", "status")
    assert shown.returncode == 0, shown.stderr
    assert "Revoked hosts" in shown.stdout and "withdrawn" in shown.stdout

    # Revoking the last replica is allowed, and says what it cost.
    r = grid(lab.home, "allocator", "node", "revoke", good.host_id)
    assert r.returncode == 0, r.stderr
    assert f"model '{MODEL}' has no ready replica now" in r.stdout
    assert f"withdrew 1 engine(s) of {good.host_id}" in r.stdout
    refused = lab.chat(key)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] in ("model_not_ready", "model_unplaceable")
    assert MODEL in refused.json()["error"]["message"]
    assert bad.served() == served_bad
    assert good.served() == served_good + AFTER_REVOKE_REQUESTS

    # A credential issued after the revocation and one heartbeat re-admit the host.
    fresh = lab.bed.node_token(bad.host_id)
    node = control_record_id(bad.host_id)
    hb = lab.bed.http.post(
        f"{lab.server.url}/nodes/{node}/heartbeat",
        headers={CONTROL_HEADER: fresh},
        json={"node_id": node, "request_commands": False},
    )
    assert hb.status_code == 200, hb.text
    assert lab.chat(key).status_code == 200
    assert bad.served() == served_bad + 1
    rows = {h["host_id"]: h["state"] for h in lab.status()["server"]["revoked_hosts"]}
    assert rows == {bad.host_id: "readmitted", good.host_id: "withdrawn"}


def test_a_node_agent_is_withdrawn_at_once_and_a_restart_with_a_new_credential_readmits_it(
    lab: Lab,
) -> None:
    # A real node agent on the Grid's own machine: it mints its credential at start.
    host = "host-agent"
    state_dir = lab.tmp / "node"
    config = NodeConfig(
        state_dir=state_dir,
        grid_url=lab.server.url,
        host_id=host,
        dedicated=True,
        heartbeat_interval_s=0.5,
        model_dirs=(lab.tmp / "models",),
    )
    env = dict(os.environ, GRID_HOME=str(lab.home))

    def controller_hosts() -> set[str]:
        return {h["host_id"] for h in lab.status()["controller"].get("hosts") or []}

    def node_hosts() -> set[str]:
        return {n["host_id"] for n in lab.status()["server"]["nodes"]}

    try:
        assert start_node(config, env=env).registered
        assert wait_until_sync(lambda: host in controller_hosts(), timeout_s=WAIT_S)
        r = grid(lab.home, "allocator", "node", "revoke", host, "--json")
        assert r.returncode == 0, r.stderr
        answer = json.loads(r.stdout)
        assert answer["control_record"] is True and answer["engines"] == []
        assert host not in node_hosts()  # at once, not when the lease lapses

        def refused() -> bool:
            rec = agent_record(state_dir)
            return rec is not None and "was revoked" in rec.last_error

        # The agent keeps heartbeating with its old credential; nothing brings the host back.
        assert wait_until_sync(refused, timeout_s=WAIT_S, interval_s=0.2)
        assert wait_until_sync(lambda: host not in controller_hosts(), timeout_s=WAIT_S)
        assert host not in node_hosts()
        stop_node(state_dir)
        # Started again, it mints a credential issued after the revocation: re-admitted.
        assert start_node(config, env=env).registered
        assert wait_until_sync(lambda: host in controller_hosts(), timeout_s=WAIT_S)
        (row,) = lab.status()["server"]["revoked_hosts"]
        assert row["host_id"] == host and row["state"] == "readmitted"
    finally:
        if agent_running(state_dir):
            stop_node(state_dir)
