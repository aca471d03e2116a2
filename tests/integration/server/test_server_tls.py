"""HTTPS control plane: real TLS on loopback with certificates made by ``grid tls init``.

Each refusal is its own test: plain HTTP control off loopback (client and server side), a
wrong CA, a SAN mismatch and an expired certificate — each refused with one line naming the
problem, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient
from server_testbed import PeerAs

from grid_core.client import Calls, GridClient, PlainHttpRefused
from grid_core.grids import GridEntry, GridsConfig, save_config
from grid_core.plugins import get_plugins
from grid_core.tls import TlsRefused, ca_fingerprint, issue_cert
from grid_server.app import build_app
from grid_server.harness import Child, start_server
from grid_server.home import OPERATOR_TOKEN_FILE

pytestmark = pytest.mark.integration

GRID_BIN = Path(sys.executable).parent / "grid"
OFF_LOOPBACK_PEER = ("198.18.0.7", 40000)
"""A LAN peer (benchmarking range, never routed): only ever an ASGI scope value here."""


def grid_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    return subprocess.run(
        [str(GRID_BIN), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def tls_init(directory: Path, *sans: str) -> Path:
    """``grid tls init DIRECTORY --san …`` (the operator's command); returns the directory."""
    flags = [x for san in sans for x in ("--san", san)]
    r = grid_cli("tls", "init", str(directory), *flags, home=directory.parent / "cli-home")
    assert r.returncode == 0, r.stderr
    return directory


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    return tls_init(tmp_path / "pki", "grid.test")


def serve_tls(home: Path, cert: Path, key: Path, ca: Path | None) -> Child:
    args = ["--tls-cert", str(cert), "--tls-key", str(key)]
    args += ["--tls-ca", str(ca)] if ca is not None else []
    return start_server(home, extra_args=args)


@pytest.fixture
def tls_server(tmp_path: Path, pki: Path) -> Iterator[tuple[Child, Path]]:
    home = tmp_path / "home"
    child = serve_tls(home, pki / "server.pem", pki / "server-key.pem", pki / "ca.pem")
    try:
        yield child, home
    finally:
        child.stop()


def test_tls_init_writes_a_ca_and_a_server_certificate_with_owner_only_keys(pki: Path) -> None:
    for name, mode in (
        ("ca.pem", 0o644),
        ("ca-key.pem", 0o600),
        ("server.pem", 0o644),
        ("server-key.pem", 0o600),
    ):
        assert (pki / name).stat().st_mode & 0o777 == mode, name
    again = grid_cli("tls", "init", str(pki), home=pki.parent / "cli-home")
    assert again.returncode == 1 and "already holds a CA" in again.stderr
    assert "Traceback" not in again.stderr


def test_https_server_answers_operator_and_node_calls_verified_by_the_ca(
    tls_server: tuple[Child, Path], pki: Path
) -> None:
    child, home = tls_server
    assert child.url.startswith("https://127.0.0.1:")
    token = (home / OPERATOR_TOKEN_FILE).read_text().strip()
    with GridClient(child.url, operator_token=token, ca_file=pki / "ca.pem") as client:
        assert client.send(Calls.set_mode("observe"))["mode"] == "observe"
        cred = client.issue_node_credential("host-tls-a", 600.0)
    with GridClient(child.url, node_token=cred.token, ca_file=pki / "ca.pem") as node:
        assert node.send(Calls.nodes()) is not None
    # The local CLI finds the server and its CA in server.json: no flag needed.
    r = grid_cli("allocator", "status", "--json", home=home)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mode"] == "observe"
    # Plain HTTP to the TLS port gets nothing.
    with pytest.raises(httpx.HTTPError):
        httpx.get(child.url.replace("https://", "http://") + "/healthz", timeout=5)


def test_wrong_ca_is_refused_with_one_line(tls_server: tuple[Child, Path], tmp_path: Path) -> None:
    child, _home = tls_server
    other = tls_init(tmp_path / "other-pki", "grid.test")
    with (
        GridClient(child.url, ca_file=other / "ca.pem") as client,
        pytest.raises(TlsRefused, match="not signed by the given CA"),
    ):
        client.send(Calls.healthz())
    # The CLI, through a named grid that carries the wrong CA: one line, exit 1.
    cli_home = tmp_path / "operator"
    entry = GridEntry(url=child.url, ca_file=str(other / "ca.pem"))
    save_config(GridsConfig(default="lab", grids={"lab": entry}), cli_home)
    r = grid_cli("allocator", "status", home=cli_home)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not signed by the given CA" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_san_mismatch_is_refused_with_one_line(tmp_path: Path, pki: Path) -> None:
    # A certificate from the same CA that covers another name only (no loopback).
    cert, key = tmp_path / "other.pem", tmp_path / "other-key.pem"
    r = grid_cli(
        "tls", "issue", str(cert), str(key), "--ca-dir", str(pki), "--san", "elsewhere.test",
        home=tmp_path / "cli-home",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    child = serve_tls(tmp_path / "home", cert, key, pki / "ca.pem")
    try:
        with (
            GridClient(child.url, ca_file=pki / "ca.pem") as client,
            pytest.raises(TlsRefused, match="SAN mismatch"),
        ):
            client.send(Calls.healthz())
        # The node agent refuses it before it starts a daemon.
        node = grid_cli(
            "allocator", "node", "start", "--grid", child.url, "--grid-ca", str(pki / "ca.pem"),
            "--state-dir", str(tmp_path / "node"), home=tmp_path / "node-home",
        )  # fmt: skip
        assert node.returncode == 1
        assert len(node.stderr.strip().splitlines()) == 1 and "SAN mismatch" in node.stderr
    finally:
        child.stop()


def test_expired_certificate_is_refused_with_one_line(tmp_path: Path, pki: Path) -> None:
    # grid tls issue only makes certificates valid from now; an expired one is made by the
    # same function with a validity window that ended yesterday.
    cert, key = tmp_path / "old.pem", tmp_path / "old-key.pem"
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=3)
    issue_cert(
        pki / "ca.pem", pki / "ca-key.pem", ["127.0.0.1"], cert, key, days=1, not_before=start
    )
    child = serve_tls(tmp_path / "home", cert, key, pki / "ca.pem")
    try:
        with (
            GridClient(child.url, ca_file=pki / "ca.pem") as client,
            pytest.raises(TlsRefused, match="expired"),
        ):
            client.send(Calls.healthz())
    finally:
        child.stop()


def test_plain_http_control_off_loopback_is_refused_by_the_client() -> None:
    # Refused before any connection is attempted: nothing is sent to the address.
    with (
        GridClient("http://198.18.0.9:22100", operator_token="secret-op") as client,
        pytest.raises(PlainHttpRefused, match="plain HTTP off loopback"),
    ):
        client.send(Calls.tick())
    with (
        GridClient("http://198.18.0.9:22100", node_token="secret-node") as client,
        pytest.raises(PlainHttpRefused, match="plain HTTP off loopback"),
    ):
        client.send(Calls.remove("host-x"))


def test_plain_http_control_off_loopback_is_refused_by_the_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    app = build_app(home, get_plugins())
    token = (home / OPERATOR_TOKEN_FILE).read_text().strip()
    headers = {"x-grid-allocator-token": token}
    lan_http = PeerAs(app, OFF_LOOPBACK_PEER, scheme="http")
    with TestClient(lan_http, base_url="http://198.18.0.1:22100") as http:
        r = http.put("/allocator/mode", json={"mode": "observe"}, headers=headers)
        assert r.status_code == 403
        assert "plain HTTP" in r.json()["error"]["message"]
        assert token not in r.text
        assert http.get("/allocator/status").json()["mode"] == "recommend"
    lan_https = PeerAs(app, OFF_LOOPBACK_PEER, scheme="https")
    with TestClient(lan_https, base_url="https://198.18.0.1:22100") as http:
        r = http.put("/allocator/mode", json={"mode": "observe"}, headers=headers)
        assert r.status_code == 200, r.text


def test_grid_up_refuses_a_private_key_others_can_read(tmp_path: Path, pki: Path) -> None:
    (pki / "server-key.pem").chmod(0o644)
    r = grid_cli(
        "up", "--port", "0", "--tls-cert", str(pki / "server.pem"),
        "--tls-key", str(pki / "server-key.pem"), home=tmp_path / "home",
    )  # fmt: skip
    assert r.returncode == 1
    assert "readable by others" in r.stderr and "chmod 600" in r.stderr
    assert "Traceback" not in r.stderr


def test_ca_fingerprint_is_the_sha256_of_the_der_certificate(pki: Path) -> None:
    r = grid_cli("tls", "fingerprint", str(pki / "ca.pem"), home=pki.parent / "cli-home")
    assert r.stdout.strip() == "sha256:" + ca_fingerprint((pki / "ca.pem").read_bytes())
    import hashlib
    import ssl

    der = ssl.PEM_cert_to_DER_cert((pki / "ca.pem").read_text())
    assert ca_fingerprint((pki / "ca.pem").read_bytes()) == hashlib.sha256(der).hexdigest()
