"""Two Grid servers on one real etcd, three node agents with real llama-server children.

Each server reaches etcd through its own loopback relay (``tests/support/tcp_proxy.py``), so
the test can cut one server off etcd (a partition) while it keeps running and serving nodes.

1. ``test_kill_9_leader_follower_takes_over_under_traffic``: automatic mode, two replicas,
   chat traffic spread over both servers; ``kill -9`` the leader. The follower is elected (the
   measured time is printed next to the lease length), profiles and mode survive, the two
   engines keep their PIDs (no command ran twice, no replica was lost), and every request was
   answered 200 or a documented 503 with Retry-After.
2. ``test_partitioned_old_leader_cannot_command``: the killed server comes back as a follower;
   the leader is cut from etcd. It stops acting at once (operator changes refused, no commands
   to nodes), the other server takes the next term and its commands are executed; a command in
   the old leader's term is refused by the real node admission check. Healed, the old leader
   follows and names the new one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec
import pytest
from etcd_process import EtcdServer, start_etcd
from grid_llamacpp.tinymodel import TinyModelSpec, make_model
from ports import port
from tcp_proxy import TcpRelay

from grid_core.client import Calls, GridClient
from grid_core.protection import ProtectionDecision
from grid_core.system import ProcessIdentity, is_gone, wait_until_sync
from grid_core.wire import Command, Heartbeat
from grid_node import admission
from grid_node.state import STATE_FILE, NodeState
from grid_server.harness import Child, Testbed, start_server
from grid_server.home import OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE

pytestmark = pytest.mark.e2e

LEASE_S = 6.0
"""Controller lease for this test (the default is 30 s): a follower takes over within about
this long after the leader dies, so the test shows it without waiting half a minute."""
HOSTS = ("host-ha-1", "host-ha-2", "host-ha-3")
PORT_BASE = 22300
"""Managed engine ports: ``PORT_BASE + 10 * i`` for host i (docs/testing.md table)."""
MODEL = "tiny.gguf"
WAIT_S = 240.0
"""Upper bound for one convergence step on a loaded two-core machine (never a timing claim)."""


def wait_for(predicate: Any, what: str, timeout_s: float = WAIT_S) -> Any:
    value = wait_until_sync(predicate, timeout_s=timeout_s, interval_s=0.1)
    if not value:
        raise AssertionError(f"timed out waiting for {what}")
    return value


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@dataclass
class Traffic:
    """Chat requests spread round-robin over the servers, like a client-side load balancer:
    a server that refuses the connection (killed) is skipped and the request goes to the next.
    """

    urls: list[str]
    codes: Counter[str] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = 0
        with httpx.Client(timeout=60.0, trust_env=False) as http:
            while not self.stop.is_set():
                i += 1
                for attempt in range(len(self.urls)):
                    url = self.urls[(i + attempt) % len(self.urls)]
                    try:
                        r = http.post(
                            f"{url}/v1/chat/completions",
                            json={
                                "model": MODEL,
                                "max_tokens": 4,
                                "messages": [{"role": "user", "content": "Say OK"}],
                            },
                        )
                    except httpx.TransportError:
                        self.codes["connection refused, sent to the next server"] += 1
                        continue
                    if r.status_code == 503 and r.headers.get("retry-after"):
                        self.codes["503 + Retry-After"] += 1
                    else:
                        self.codes[str(r.status_code)] += 1
                        if r.status_code != 200:
                            self.bad.append(f"{r.status_code} {r.text[:200]}")
                    break
                time.sleep(0.05)


@dataclass
class HaGrid:
    tmp: Path
    etcd: EtcdServer
    relays: dict[str, TcpRelay]
    servers: dict[str, Child]
    homes: dict[str, Path]
    policy: Path
    env: dict[str, str]
    state_dirs: dict[str, Path] = field(default_factory=dict)
    beds: dict[str, Testbed] = field(default_factory=dict)

    def start_server(self, name: str, port: int = 0) -> Child:
        """Start server ``name``; ``port`` given: on the address the node agents know."""
        args = [
            "--state-store",
            f"etcd://{self.relays[name].address}",
            "--policy",
            str(self.policy),
            "--port",
            str(port),
        ]
        child = start_server(self.homes[name], tick_interval_s=1.0, extra_args=args)
        self.servers[name] = child
        return child

    def bed(self, name: str) -> Testbed:
        """The operator's view of server ``name`` (one per server URL, closed at teardown)."""
        url = self.servers[name].url
        bed = self.beds.get(url)
        if bed is None:
            bed = self.beds[url] = Testbed(url, self.homes[name])
        return bed

    def status(self, name: str) -> dict[str, Any] | None:
        try:
            r = httpx.get(f"{self.servers[name].url}/allocator/status", timeout=10.0)
            return r.json() if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def role(self, name: str) -> str | None:
        doc = self.status(name)
        return None if doc is None else doc["server"]["state_store"]["role"]

    def leader(self) -> str:
        return wait_for(
            lambda: next((n for n in self.servers if self.role(n) == "leader"), None),
            "a leader",
        )

    def term(self, name: str) -> int:
        doc = self.status(name)
        assert doc is not None
        return int(doc["server"]["state_store"]["leader"]["term"])

    def node_state(self, host: str) -> NodeState:
        return msgspec.json.decode(
            (self.state_dirs[host] / STATE_FILE).read_bytes(), type=NodeState
        )

    def engine_pids(self) -> dict[str, int]:
        """host → live llama-server PID of the model (proven: recorded birth and port)."""
        out = {}
        for host in HOSTS:
            child = self.node_state(host).children.get(MODEL)
            if child is None or child.state != "ready":
                continue
            ident = ProcessIdentity(child.pid, child.birth, args=(("--port", str(child.port)),))
            if ident.prove().status == "proven":
                out[host] = child.pid
        return out


def _write_token(path: Path, host: str, token: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, json.dumps({"host_id": host, "token": token}).encode())
    os.close(fd)


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaGrid]:
    tmp = tmp_path_factory.mktemp("ha")
    etcd = start_etcd(tmp / "etcd")
    host, _, etcd_port = etcd.url.split("://", 1)[1].rpartition(":")
    relays = {n: TcpRelay(host, int(etcd_port)) for n in ("a", "b")}
    policy = tmp / "policy.json"
    policy.write_text(json.dumps({"controller_lease_s": LEASE_S}))
    homes = {n: tmp / f"home-{n}" for n in ("a", "b")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(homes["a"])
    grid = HaGrid(tmp, etcd, relays, {}, homes, policy, env)
    try:
        grid.start_server("a")
        # Servers of one grid share the operator capability and the node-credential key.
        homes["b"].mkdir(mode=0o700)
        for name in (OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE):
            shutil.copy2(homes["a"] / name, homes["b"] / name)
        grid.start_server("b")
        models = tmp / "models"
        make_model(models / MODEL, TinyModelSpec(name="tiny", seed=5))
        bed = grid.bed("a")
        for i, h in enumerate(HOSTS):
            token_file = tmp / f"{h}.token"
            _write_token(token_file, h, bed.node_token(h))
            grid.state_dirs[h] = tmp / "nodes" / h
            low = port(PORT_BASE + 10 * i)
            started = cli(
                env,
                "allocator", "node", "start",
                "--grid", grid.servers["a"].url,
                "--grid-peer", grid.servers["b"].url,
                "--token-file", str(token_file),
                "--host-id", h,
                "--state-dir", str(grid.state_dirs[h]),
                "--port-range", f"{low}-{low + 9}",
                "--models-dir", str(models),
                "--heartbeat-interval", "1",
                "--dedicated",
            )  # fmt: skip
            assert started.returncode == 0, started.stderr + started.stdout
        yield grid
    finally:
        for bed in grid.beds.values():
            bed.close()
        for sdir in grid.state_dirs.values():
            cli(env, "allocator", "node", "stop", "--state-dir", str(sdir))
        for child in grid.servers.values():
            child.stop()
        for relay in relays.values():
            relay.close()
        etcd.stop()


def test_kill_9_leader_follower_takes_over_under_traffic(ha: HaGrid) -> None:
    leader = ha.leader()
    follower = next(n for n in ha.servers if n != leader)
    assert ha.role(follower) == "follower"
    lead, follow = ha.bed(leader), ha.bed(follower)

    # A follower refuses operator changes and names the leader.
    refused = follow.http.put(
        f"{follow.url}/allocator/mode", headers=follow.operator(), json={"mode": "automatic"}
    )
    assert refused.status_code == 503, refused.text
    assert ha.servers[leader].url in refused.text

    profile = {"model_id": MODEL, "memory_mb": 64, "min_replicas": 2, "max_replicas": 2}
    r = lead.http.put(f"{lead.url}/allocator/models/{MODEL}", headers=lead.operator(), json=profile)
    assert r.status_code == 200, r.text
    r = lead.http.put(
        f"{lead.url}/allocator/mode", headers=lead.operator(), json={"mode": "automatic"}
    )
    assert r.status_code == 200, r.text
    engines = wait_for(lambda: (p := ha.engine_pids()) and len(p) == 2 and p, "two ready replicas")
    # Both routers serve: engines registered with every server.
    for bed in (lead, follow):
        wait_for(lambda bed=bed: MODEL in bed.client.models(), f"{MODEL} routed by {bed.url}")
    term_before = ha.term(leader)

    traffic = Traffic([ha.servers[n].url for n in sorted(ha.servers)])
    sender = threading.Thread(target=traffic.run, daemon=True)
    sender.start()
    lowest = [len(engines)]

    def watch_floor() -> None:
        while not traffic.stop.is_set():
            lowest[0] = min(lowest[0], len(ha.engine_pids()))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch_floor, daemon=True)
    watcher.start()
    try:
        time.sleep(3.0)  # traffic on both servers before the kill
        killed = ha.servers[leader]
        os.kill(killed.pid, signal.SIGKILL)  # our own child, by PID
        t_kill = time.monotonic()
        wait_for(lambda: ha.role(follower) == "leader", "the follower to take over")
        took_s = time.monotonic() - t_kill
        print(
            f"\nfailover: follower elected {took_s:.2f} s after kill -9 of the leader "
            f"(lease {LEASE_S:.0f} s; loaded two-core machine)"
        )
        wait_for(lambda: is_gone(killed.pid), "the killed server to be gone")
        time.sleep(6.0)  # traffic keeps flowing through the new leader
    finally:
        traffic.stop.set()
        sender.join(timeout=120)
        watcher.join(timeout=30)

    doc = ha.status(follower)
    assert doc is not None
    store = doc["server"]["state_store"]
    assert store["leader"]["term"] == term_before + 1
    assert store["leader"]["url"] == ha.servers[follower].url
    assert doc["mode"] == "automatic"  # mode survived
    assert doc["server"]["profiles"] == [MODEL]  # the profile survived
    # The same two engines: nothing restarted, nothing warmed twice, never below two.
    assert ha.engine_pids() == engines
    assert lowest[0] == 2
    warms = Counter(
        (h, r.model_id)
        for h in HOSTS
        for r in ha.node_state(h).receipts
        if r.kind == "warm" and r.ack.status == "succeeded"
    )
    assert sum(warms.values()) == 2 and max(warms.values()) == 1, warms
    ids = [r.ack.action_id for h in HOSTS for r in ha.node_state(h).receipts]
    assert len(ids) == len(set(ids))
    print("traffic across the failover:", dict(traffic.codes))
    assert traffic.bad == [], traffic.bad[:5]
    assert traffic.codes["200"] > 0


def test_partitioned_old_leader_cannot_command(ha: HaGrid) -> None:
    # The server killed in the previous test comes back on its address: it follows.
    for name in list(ha.servers):
        if is_gone(ha.servers[name].pid):
            ha.start_server(name, port=urlsplit(ha.servers[name].url).port or 0)
    leader = ha.leader()
    other = next(n for n in ha.servers if n != leader)
    wait_for(lambda: ha.role(other) == "follower", "the restarted server to follow")
    old_term = ha.term(leader)
    old = ha.status(leader)
    assert old is not None
    old_id = old["server"]["state_store"]["server_id"]

    ha.relays[leader].cut()  # the leader keeps running, but cannot reach etcd
    t_cut = time.monotonic()
    wait_for(lambda: ha.role(other) == "leader", "the other server to take over")
    print(f"\npartition: other server elected {time.monotonic() - t_cut:.2f} s after the cut")
    new_term = ha.term(other)
    assert new_term == old_term + 1

    # The cut-off leader acts no more: operator changes are refused, no command goes out.
    cut_bed = ha.bed(leader)
    refused = cut_bed.http.put(
        f"{cut_bed.url}/allocator/mode", headers=cut_bed.operator(), json={"mode": "recommend"}
    )
    assert refused.status_code == 503 and "etcd" in refused.text, refused.text
    token = json.loads((ha.tmp / f"{HOSTS[0]}.token").read_text())["token"]
    with GridClient(cut_bed.url, node_token=token) as node:
        hb = Heartbeat(node_id=f"ctl.{HOSTS[0]}", host_id=HOSTS[0], request_commands=True)
        answer = node.send(Calls.heartbeat(f"ctl.{HOSTS[0]}", hb))
    assert answer.allocator is not None and answer.allocator.follower
    assert answer.allocator.commands == [] and answer.allocator.controller_lease_ttl_seconds == 0

    # The new leader commands: a third replica is warmed under the new term.
    bed = ha.bed(other)
    profile = {"model_id": MODEL, "memory_mb": 64, "min_replicas": 3, "max_replicas": 3}
    r = bed.http.put(f"{bed.url}/allocator/models/{MODEL}", headers=bed.operator(), json=profile)
    assert r.status_code == 200, r.text
    wait_for(lambda: len(ha.engine_pids()) == 3, "a third replica from the new leader")
    third = next(h for h in HOSTS if ha.node_state(h).highest_term == new_term)
    state = ha.node_state(third)
    now_leading = ha.status(other)
    assert now_leading is not None
    assert state.term_controller_id == now_leading["server"]["state_store"]["server_id"]

    # A command in the cut-off leader's term is refused by the node's own admission check.
    stale = Command(
        action_id="stale-from-partitioned-leader",
        kind="warm",
        node_id=third,
        model_id=MODEL,
        memory_mb=64,
        plan_generation="e:00000000000000000099:d",
        controller_term=old_term,
        controller_id=old_id,
        controller_lease_expires_at=time.time() + LEASE_S,
        executable=True,
    )
    decision = ProtectionDecision(
        state="accepting",
        reason="dedicated",
        sensor_state="accepting",
        sensor_reason="",
        raw_state="accepting",
    )
    reason = admission.check(
        stale,
        host_id=third,
        node_id=f"ctl.{third}",
        state=state,
        deadline_mono=time.monotonic() + LEASE_S,
        now_mono=time.monotonic(),
        decision=decision,
    )
    assert reason is not None and "below the highest" in reason

    # Healed: the old leader finds its lease gone and follows, naming the new leader.
    ha.relays[leader].heal()
    wait_for(lambda: ha.role(leader) == "follower", "the old leader to follow")

    # Its status names the new leader once it has read the leader record after the heal (the
    # record can lag its role by one read on a loaded machine).
    def names_the_new_leader() -> bool:
        doc = ha.status(leader)
        return doc is not None and (
            doc["server"]["state_store"]["leader"]["url"] == ha.servers[other].url
        )

    wait_for(names_the_new_leader, "the old leader to name the new one")
