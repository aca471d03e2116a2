"""Three machines in network namespaces: the server, and two node hosts with real llama-server.

A private lab (``tests/support/netns.py``): three namespaces on one bridge with 198.18.x.y
addresses. ``grid up`` serves HTTPS in ``server`` with a private CA made by ``grid tls init``;
``node-a`` and ``node-b`` run real node agents (``ip netns exec … grid allocator node start``)
provisioned with one join file each (``grid allocator join write`` → ``node start --join``),
whose llama-server children stay on their own loopback behind the agents' TLS fronts, each
front with a certificate issued for its host's address. The test process is the client: it
reaches the server over the lab bridge.

Then node-b's link goes down. While it is cut off: node-b turns stale and gets nothing new,
the baseline's replica on node-a is never lost, every request is served (only node-a can
answer), and the model that ran only on node-b gets a replica on node-a because its minimum
needs one. When the link comes back, node-b's running engines are adopted — the same
processes, one record each — not started a second time.

Along the way: an engine port reached without the key serves nothing, and no secret appears
in the command line or environment of any process the test started, in any log, in status
or in ``/nodes``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from grid_llamacpp.tinymodel import TinyModelSpec, make_model
from netns import pem_secret_lines, secrets_exposed, secrets_in_texts

from grid_core.client import tls_verify
from grid_core.system import wait_until_sync
from grid_core.system.netns import LabHost, NetLab
from grid_server.harness import Testbed
from grid_server.home import OPERATOR_TOKEN_FILE

pytestmark = pytest.mark.e2e

SERVER_PORT = 22100
"""The server's port inside its own namespace (private to this lab: no clash possible)."""
WAIT_S = 240.0
"""Upper bound for one convergence step on two loaded cores (never asserted as a time)."""
STALE_S = 8.0
"""Heartbeat age after which the controller stops placing on a host (policy for this test;
the default is 90 s)."""
HEARTBEAT_S = "0.5"
CLI_TIMEOUT_S = 300.0
BASELINE = "tiny-base.gguf"
"""Two replicas, one per failure domain: the baseline whose last ready replica must survive."""
SOLO = "tiny-solo.gguf"
"""One replica, first placed on node-b: it needs a new home on node-a when node-b is cut off."""
CHAT_EVERY_S = 1.0
"""Pause between the sampler's requests while node-b is cut off."""


def _cmdline(pid: int) -> str:
    """``pid``'s command line, or "" when it has exited since the namespace listed it."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.NoSuchProcess:
        return ""


def grid_cli(host: LabHost, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``grid *args`` inside ``host``'s namespace with ``GRID_HOME=home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    argv = host.argv([sys.executable, "-c", "from grid_core.cli import main; main()", *args])
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (
        f"{done.args[-6:]} → {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def wait_for(predicate, what: str, timeout_s: float = WAIT_S):
    value = wait_until_sync(predicate, timeout_s=timeout_s, interval_s=0.5)
    if not value:
        raise AssertionError(f"timed out waiting for {what}")
    return value


@dataclass
class Fleet:
    """The lab, its files and the operator's view of the server."""

    lab: NetLab
    root: Path
    url: str = ""
    ca: Path = Path()
    bed: Testbed | None = None
    client_key: str = ""
    join_tokens: dict[str, str] = field(default_factory=dict)
    node_dirs: dict[str, Path] = field(default_factory=dict)
    secret_files: dict[str, Path] = field(default_factory=dict)

    @property
    def server(self) -> LabHost:
        return self.lab.host("server")

    def home(self, name: str) -> Path:
        return self.root / name / "home"

    def children(self, name: str) -> dict[str, dict]:
        doc = json.loads((self.node_dirs[name] / "node.json").read_text())
        return doc["children"]

    def engines(self) -> list[dict]:
        assert self.bed is not None
        nodes = self.bed.http.get(self.url + "/nodes").json()["nodes"]
        return [n for n in nodes if n.get("role") == "engine" and n.get("live")]

    def chat(self, model: str) -> httpx.Response:
        assert self.bed is not None
        return self.bed.http.post(
            self.url + "/v1/chat/completions",
            json={
                "model": model,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Reply with OK"}],
            },
            headers={"Authorization": f"Bearer {self.client_key}"},
            timeout=120.0,
        )

    def status(self) -> dict:
        assert self.bed is not None
        r = self.bed.http.get(self.url + "/allocator/status?detail=1")
        r.raise_for_status()
        return r.json()


@pytest.fixture
def fleet(netlab, tmp_path: Path, llama_server: Path):
    lab = netlab(("server", "node-a", "node-b"))
    f = Fleet(lab=lab, root=tmp_path)
    try:
        yield f
    finally:
        # Graceful first (agents drain and stop their proven children, then the server);
        # the lab then stops anything still running in its namespaces and removes them.
        for name in ("node-a", "node-b"):
            if name in f.node_dirs:
                with contextlib.suppress(Exception):
                    grid_cli(
                        lab.host(name),
                        f.home(name),
                        "allocator",
                        "node",
                        "stop",
                        "--state-dir",
                        str(f.node_dirs[name]),
                        "--force",
                    )
        with contextlib.suppress(Exception):
            grid_cli(f.server, f.home("server"), "down")
        if f.bed is not None:
            f.bed.close()


def start_server(f: Fleet) -> None:
    home = f.home("server")
    home.mkdir(parents=True)
    tls_dir = home / "tls"
    ok(grid_cli(f.server, home, "tls", "init", str(tls_dir), "--san", f.server.address))
    f.ca = tls_dir / "ca.pem"
    f.secret_files.update(
        {"server TLS key": tls_dir / "server-key.pem", "CA key": tls_dir / "ca-key.pem"}
    )
    policy = home / "policy.json"
    policy.write_text(
        json.dumps(
            {
                "planner": {"stale_heartbeat_s": STALE_S},
                "governor": {"heartbeat_stale_s": STALE_S},
            }
        )
    )
    ok(
        grid_cli(
            f.server,
            home,
            "up",
            "--detach",
            "--host",
            f.server.address,
            "--port",
            str(SERVER_PORT),
            "--tls-cert",
            str(tls_dir / "server.pem"),
            "--tls-key",
            str(tls_dir / "server-key.pem"),
            "--tls-ca",
            str(f.ca),
            "--policy",
            str(policy),
            "--tick-interval",
            "1",
        )
    )
    f.url = f"https://{f.server.address}:{SERVER_PORT}"
    f.bed = Testbed(
        f.url, home, http=httpx.Client(verify=tls_verify(f.ca), timeout=60.0, trust_env=False)
    )
    f.secret_files["operator token"] = home / OPERATOR_TOKEN_FILE
    # A server bound off loopback requires client API keys on /v1: this test is a client.
    key_file = home / "client-key"
    ok(grid_cli(f.server, home, "keys", "create", "e2e-client", "--file", str(key_file)))
    f.client_key = key_file.read_text().strip()
    f.secret_files["client API key"] = key_file


def start_node(f: Fleet, name: str, models: Path, llama_server: Path) -> None:
    host = f.lab.host(name)
    home = f.home(name)
    home.mkdir(parents=True)
    host_id = f"host-{name}"
    # One file provisions the machine: the server URL, the CA pin and a one-time token.
    join_file = home / "join.json"
    ok(
        grid_cli(
            f.server,
            f.home("server"),
            "allocator",
            "join",
            "write",
            str(join_file),
            "--host-id",
            host_id,
            "--url",
            f.url,
        )
    )
    f.join_tokens[name] = json.loads(join_file.read_text())["join_token"]
    certs = home / "engine-tls"
    certs.mkdir(mode=0o700)
    cert, key = certs / "engine.pem", certs / "engine-key.pem"
    ok(
        grid_cli(
            f.server,
            f.home("server"),
            "tls",
            "issue",
            str(cert),
            str(key),
            "--san",
            host.address,
            "--ca-dir",
            str(f.home("server") / "tls"),
        )
    )
    f.secret_files[f"{name} engine TLS key"] = key
    state = home / "node"
    f.node_dirs[name] = state
    ok(
        grid_cli(
            host,
            home,
            "allocator",
            "node",
            "start",
            "--join",
            str(join_file),
            "--state-dir",
            str(state),
            "--models-dir",
            str(models),
            "--llama-server",
            str(llama_server),
            "--heartbeat-interval",
            HEARTBEAT_S,
            "--failure-domain",
            f"fd-{name}",
            "--capacity-share",
            "0.4",
            "--advertise-host",
            host.address,
            "--engine-tls-cert",
            str(cert),
            "--engine-tls-key",
            str(key),
            # No --engine-tls-ca: the engines' certificates come from the Grid's own CA, which
            # the join pinned, and the server verifies them with it.
        )
    )
    f.secret_files[f"{name} engine key"] = state / "engine-api-key"
    f.secret_files[f"{name} credential"] = state / "node-token"
    assert not join_file.exists()  # spent


def put_profile(f: Fleet, model: str, **fields: object) -> None:
    assert f.bed is not None
    body = {"model_id": model, "memory_mb": 64, "min_residency_s": 0, **fields}
    r = f.bed.http.put(f"{f.url}/allocator/models/{model}", headers=f.bed.operator(), json=body)
    assert r.status_code == 200, r.text


def engine_hosts(f: Fleet, model: str) -> set[str]:
    return {e["host_id"] for e in f.engines() if model in e.get("models", [])}


def secret_values(f: Fleet) -> dict[str, str]:
    out: dict[str, str] = {f"{name} join token": t for name, t in f.join_tokens.items()}
    for name, path in f.secret_files.items():
        text = path.read_text().strip()
        if "PRIVATE KEY" in text:
            for i, line in enumerate(pem_secret_lines(path)):
                out[f"{name} (line {i})"] = line
        elif text.startswith("{"):
            out[name] = json.loads(text)["token"]
        else:
            out[name] = text
    return out


def test_three_hosts_over_tls_survive_a_cut_link(fleet: Fleet, tmp_path: Path, llama_server):
    f = fleet
    models = tmp_path / "models"
    make_model(models / BASELINE, TinyModelSpec(name="base", seed=11))
    make_model(models / SOLO, TinyModelSpec(name="solo", seed=12))
    start_server(f)
    assert f.bed is not None
    ops = f.bed.operator()

    # node-b first, so the one-replica model lands there.
    start_node(f, "node-b", models, llama_server)
    put_profile(f, SOLO, min_replicas=1, max_replicas=1)
    r = f.bed.http.put(f.url + "/allocator/mode", headers=ops, json={"mode": "automatic"})
    assert r.status_code == 200, r.text
    wait_for(lambda: engine_hosts(f, SOLO) == {"host-node-b"}, "the solo model on node-b")
    start_node(f, "node-a", models, llama_server)
    put_profile(f, BASELINE, min_replicas=2, max_replicas=2, min_failure_domains=2)
    wait_for(
        lambda: engine_hosts(f, BASELINE) == {"host-node-a", "host-node-b"},
        "the baseline on both nodes",
    )

    # Engines are registered at their hosts' TLS fronts on the lab link, never loopback.
    a, b = f.lab.host("node-a"), f.lab.host("node-b")
    urls = {(e["host_id"], e["models"][0]): e["url"] for e in f.engines()}
    for (host_id, _model), url in urls.items():
        addr = a.address if host_id == "host-node-a" else b.address
        assert url.startswith(f"https://{addr}:"), url
    # Real completions through the server, from engines on both nodes.
    for model in (BASELINE, SOLO, BASELINE, BASELINE):
        r = f.chat(model)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0

    # An engine port reached without the key serves nothing (health and listing included).
    front = urls[("host-node-a", BASELINE)]
    with httpx.Client(verify=tls_verify(f.ca), timeout=30.0, trust_env=False) as direct:
        for method, path in (
            ("GET", "/health"),
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
        ):
            refused = direct.request(method, front + path, json={} if method == "POST" else None)
            assert refused.status_code == 401, (path, refused.text)
        wrong = direct.get(front + "/v1/models", headers={"Authorization": "Bearer not-the-key"})
        assert wrong.status_code == 401
    with pytest.raises(httpx.HTTPError):
        httpx.get(front.replace("https://", "http://") + "/health", timeout=10.0)

    # No secret in argv or environ of any process the test started (all live in the lab).
    secrets = secret_values(f)
    procs = [ident.pid for ident in f.lab.processes()]
    assert len(procs) >= 5  # server, two agents, three engines
    assert secrets_exposed(procs, secrets) == []

    # --- node-b's link goes down -------------------------------------------------------
    pids_b = {m: c["pid"] for m, c in f.children("node-b").items()}
    base_a = f.children("node-a")[BASELINE]["pid"]
    results: list[tuple[bool, int, bool]] = []  # (node-b known stale, status, Retry-After)
    lost: list[str] = []
    stale = threading.Event()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            child = f.children("node-a").get(BASELINE)
            if not child or child["state"] != "ready" or child["pid"] != base_a:
                lost.append(f"node-a baseline replica: {child}")
            known = stale.is_set()
            r = f.chat(BASELINE)
            results.append((known, r.status_code, "retry-after" in r.headers))
            stop.wait(CHAT_EVERY_S)

    def host_b() -> dict:
        return next(h for h in f.status()["controller"]["hosts"] if h["host_id"] == "host-node-b")

    f.lab.link_down("node-b")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        wait_for(lambda: not host_b()["admitting"], "node-b to go stale")
        stale.set()
        wait_for(lambda: "host-node-a" in engine_hosts(f, SOLO), "the solo model on node-a")
        # Nothing is ever placed on node-b while it is cut off.
        ctl = f.status()["controller"]
        assert [c for c in ctl.get("pending_commands", []) if "node-b" in json.dumps(c)] == []
        assert [i for i in ctl["reconciliation"]["issued"] if "node-b" in i] == []
        r = f.chat(SOLO)
        assert r.status_code == 200, r.text
        wait_for(lambda: sum(1 for known, *_ in results if known) >= 5, "requests after staleness")
    finally:
        stop.set()
        sampler.join(180)
    assert lost == []  # the baseline's replica on node-a stayed ready, the same process
    # While node-b was still thought alive, a request already sent to it may be lost (a POST
    # is never resent) and is refused with Retry-After; once node-b is stale, every request is
    # served by node-a.
    assert all(code == 200 or (code == 503 and retry) for _, code, retry in results), results
    assert all(code == 200 for known, code, _ in results if known), results

    # --- the link comes back ------------------------------------------------------------
    f.lab.link_up("node-b")
    wait_for(lambda: (host_b()["heartbeat_age_s"] or 99.0) < STALE_S, "node-b heartbeating again")
    wait_for(lambda: "host-node-b" in engine_hosts(f, BASELINE), "node-b's baseline routed again")
    # Adopted, not duplicated: the same engine processes, one record per host and model.
    after = f.children("node-b")
    for model, pid in pids_b.items():
        assert model in after and after[model]["pid"] == pid, (model, after.get(model))
    llamas_b = [p for p in b.pids() if "llama-server" in _cmdline(p)]
    assert len(llamas_b) == len(after)
    records = [(e["host_id"], tuple(e["models"])) for e in f.engines()]
    assert len(records) == len(set(records))
    # node-b saw its own link go down: it stays fenced until its network has been fine for its
    # recovery period, then accepts work again.
    wait_for(lambda: host_b()["admitting"], "node-b accepting again")
    state_b = json.loads((f.node_dirs["node-b"] / "node.json").read_text())
    warms = [r for r in state_b["receipts"] if r["kind"] == "warm" and r["model_id"] == BASELINE]
    assert len(warms) == 1
    assert f.children("node-b")[BASELINE]["pid"] == pids_b[BASELINE]
    r = f.chat(BASELINE)
    assert r.status_code == 200, r.text

    # Nothing secret in logs, status or /nodes either, and still none in any process.
    texts = {
        "server log": (f.home("server") / "server.log").read_text(errors="replace"),
        "status": json.dumps(f.status()),
        "/nodes": f.bed.http.get(f.url + "/nodes").text,
    }
    for name, state in f.node_dirs.items():
        for log in (state / "logs").glob("*"):
            texts[f"{name} {log.name}"] = log.read_text(errors="replace")
        for log in state.glob("*.log"):
            texts[f"{name} {log.name}"] = log.read_text(errors="replace")
        texts[f"{name} status"] = grid_cli(
            f.lab.host(name),
            f.home(name),
            "allocator",
            "node",
            "status",
            "--json",
            "--state-dir",
            str(state),
        ).stdout
    assert secrets_in_texts(texts, secret_values(f)) == []
    assert secrets_exposed([i.pid for i in f.lab.processes()], secret_values(f)) == []
