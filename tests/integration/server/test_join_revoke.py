"""Provisioning over real TLS on loopback: one-time join tokens that pin the CA, and revoking
a host. Certificates are made by ``grid tls init``; every refusal is its own test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import psutil
import pytest

from grid_core.bodies import JoinFile
from grid_core.client import Calls, GridClient, RequestRefused, tls_verify
from grid_core.system import wait_until_sync
from grid_core.tls import TlsRefused, ca_fingerprint
from grid_core.wire import CONTROL_HEADER, control_record_id
from grid_node.join import join
from grid_server.harness import Child, Testbed, start_server

pytestmark = pytest.mark.integration

GRID_BIN = Path(sys.executable).parent / "grid"


def grid_cli(*args: str, home: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    return subprocess.run(
        [str(GRID_BIN), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class TlsGrid:
    """A real HTTPS server on loopback, its home and its CA."""

    def __init__(self, child: Child, home: Path, ca: Path) -> None:
        self.child, self.home, self.ca = child, home, ca
        self.bed = Testbed(child.url, home, http=httpx.Client(timeout=30, verify=tls_verify(ca)))

    def join_write(self, path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
        return grid_cli("allocator", "join", "write", str(path), *flags, home=self.home)

    def heartbeat(self, token: str, host: str) -> httpx.Response:
        node = control_record_id(host)
        return self.bed.http.post(
            f"{self.child.url}/nodes/{node}/heartbeat",
            headers={CONTROL_HEADER: token},
            json={"node_id": node, "request_commands": False},
        )


@pytest.fixture
def tls_grid(tmp_path: Path) -> Iterator[TlsGrid]:
    pki = tmp_path / "pki"
    r = grid_cli("tls", "init", str(pki), "--san", "grid.test", home=tmp_path / "cli")
    assert r.returncode == 0, r.stderr
    home = tmp_path / "home"
    child = start_server(
        home,
        extra_args=[
            "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server-key.pem"),
            "--tls-ca", str(pki / "ca.pem"),
        ],
    )  # fmt: skip
    grid = TlsGrid(child, home, pki / "ca.pem")
    try:
        yield grid
    finally:
        grid.bed.close()
        child.stop()


def test_join_file_carries_url_and_ca_pin_and_becomes_a_host_credential(
    tls_grid: TlsGrid, tmp_path: Path
) -> None:
    path = tmp_path / "join-worker"
    r = tls_grid.join_write(path, "--host-id", "host-worker-1")
    assert r.returncode == 0, r.stderr
    assert path.stat().st_mode & 0o777 == 0o600
    doc = msgspec.json.decode(path.read_bytes(), type=JoinFile)
    assert doc.grid_url == tls_grid.child.url
    assert doc.ca_sha256 == ca_fingerprint(tls_grid.ca.read_bytes())
    assert doc.join_token not in r.stdout + r.stderr  # the secret is never printed
    joined = join(path, tmp_path / "node-state")
    assert joined.host_id == "host-worker-1" and not path.exists()  # spent, removed
    assert joined.ca_file is not None and joined.ca_file.read_bytes() == tls_grid.ca.read_bytes()
    assert joined.token_file.stat().st_mode & 0o777 == 0o600
    token = json.loads(joined.token_file.read_text())["token"]
    tls_grid.bed.register_host(token, "host-worker-1")
    assert tls_grid.heartbeat(token, "host-worker-1").status_code == 200


def test_replayed_join_token_is_refused(tls_grid: TlsGrid, tmp_path: Path) -> None:
    path = tmp_path / "join"
    assert tls_grid.join_write(path, "--host-id", "host-replay").returncode == 0
    copy = tmp_path / "join-copy"
    shutil.copy2(path, copy)
    join(path, tmp_path / "first")
    with pytest.raises(RequestRefused, match="already used") as err:
        join(copy, tmp_path / "second")
    assert err.value.status == 401
    assert not (tmp_path / "second" / "node-token").exists()


def test_replay_is_refused_after_a_server_restart(tmp_path: Path) -> None:
    # Spent join ids are durable: a restart does not make a used token work again.
    home = tmp_path / "home"
    first = start_server(home)
    try:
        r = grid_cli(
            "allocator", "join", "write", str(tmp_path / "j"), "--grid", first.url, home=home
        )
        assert r.returncode == 0, r.stderr
        shutil.copy2(tmp_path / "j", tmp_path / "j2")
        join(tmp_path / "j", tmp_path / "a")
    finally:
        first.stop()
    second = start_server(home)
    try:
        doc = msgspec.json.decode((tmp_path / "j2").read_bytes(), type=JoinFile)
        replay = msgspec.structs.replace(doc, grid_url=second.url)
        (tmp_path / "j2").write_bytes(msgspec.json.encode(replay))
        with pytest.raises(RequestRefused, match="already used"):
            join(tmp_path / "j2", tmp_path / "b")
    finally:
        second.stop()


def test_expired_join_token_is_refused(tls_grid: TlsGrid, tmp_path: Path) -> None:
    path = tmp_path / "join"
    assert tls_grid.join_write(path, "--ttl-minutes", "0.01").returncode == 0  # 0.6 s
    expires_at = msgspec.json.decode(path.read_bytes(), type=JoinFile).expires_at
    import time

    assert wait_until_sync(lambda: time.time() > expires_at + 0.1, timeout_s=10, interval_s=0.1)
    with pytest.raises(RequestRefused, match="expired"):
        join(path, tmp_path / "node")


def test_join_refuses_a_server_whose_ca_does_not_match_the_pin(
    tls_grid: TlsGrid, tmp_path: Path
) -> None:
    path = tmp_path / "join"
    assert tls_grid.join_write(path).returncode == 0
    doc = msgspec.json.decode(path.read_bytes(), type=JoinFile)
    forged = msgspec.structs.replace(doc, ca_sha256="0" * 64)
    path.write_bytes(msgspec.json.encode(forged))
    with pytest.raises(TlsRefused, match="not the one the join token pins"):
        join(path, tmp_path / "node")
    # Nothing was spent: the real pin still works with the same token.
    path.write_bytes(msgspec.json.encode(doc))
    assert join(path, tmp_path / "node").host_id == doc.host_id


def test_node_start_with_a_join_file_registers_over_https(
    tls_grid: TlsGrid, tmp_path: Path
) -> None:
    path = tmp_path / "join"
    assert tls_grid.join_write(path, "--host-id", "host-joined").returncode == 0
    join_token = msgspec.json.decode(path.read_bytes(), type=JoinFile).join_token
    state = tmp_path / "node"
    node_home = tmp_path / "node-home"
    r = grid_cli(
        "allocator", "node", "start", "--join", str(path), "--state-dir", str(state),
        "--heartbeat-interval", "0.5", "--models-dir", str(tmp_path), home=node_home,
    )  # fmt: skip
    try:
        assert r.returncode == 0, r.stderr
        assert "joined" in r.stdout and "host-joined" in r.stdout
        nodes = tls_grid.bed.http.get(tls_grid.child.url + "/nodes").json()["nodes"]
        assert any(n.get("host_id") == "host-joined" for n in nodes)
        config = json.loads((state / "node-config.json").read_text())
        assert config["grid_url"].startswith("https://") and config["grid_ca"]
        # No secret in the daemon's argv or environment, the config, its log or the server's.
        credential = json.loads((state / "node-token").read_text())["token"]
        daemon = psutil.Process(json.loads((state / "agent.json").read_text())["pid"])
        exposed = [
            " ".join(daemon.cmdline()),
            json.dumps(daemon.environ()),
            (state / "node-config.json").read_text(),
            tls_grid.child.log.read_text(),
            (state / "agent.log").read_text() if (state / "agent.log").exists() else "",
            r.stdout + r.stderr,
        ]
        for text in exposed:
            assert credential not in text and join_token not in text
    finally:
        stop = grid_cli("allocator", "node", "stop", "--state-dir", str(state), home=node_home)
        assert stop.returncode == 0, stop.stderr


def test_revoked_host_fails_at_its_next_heartbeat_and_nothing_else_changes(
    tls_grid: TlsGrid,
) -> None:
    bed = tls_grid.bed
    bad, good = bed.node_token("host-bad"), bed.node_token("host-good")
    bed.register_host(bad, "host-bad")
    bed.register_host(good, "host-good")
    assert tls_grid.heartbeat(bad, "host-bad").status_code == 200
    r = grid_cli("allocator", "node", "revoke", "host-bad", home=tls_grid.home)
    assert r.returncode == 0, r.stderr
    refused = tls_grid.heartbeat(bad, "host-bad")
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    assert bad not in refused.text
    # The other host is untouched: its heartbeat works and its record is still live.
    assert tls_grid.heartbeat(good, "host-good").status_code == 200
    with GridClient(tls_grid.child.url, ca_file=tls_grid.ca) as client:
        status = client.send(Calls.status())
    assert [h["host_id"] for h in status["server"]["revoked_hosts"]] == ["host-bad"]
    live = {n["host_id"] for n in status["server"]["nodes"]}
    assert "host-good" in live
    text = json.dumps(status)
    assert bad not in text and good not in text
    # Provisioning the host again re-admits it (a credential issued after the revocation).
    fresh = bed.node_token("host-bad")
    assert tls_grid.heartbeat(fresh, "host-bad").status_code == 200
