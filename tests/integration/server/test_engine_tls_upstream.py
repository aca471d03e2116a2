"""The server reaches an ``https://`` engine through its TLS front and verifies it against the
CA the node registered, hostname included; the CA never shows in public output.

Real server process, a FAKE engine (a separate process on loopback) and the node's real TLS
front (``python -m grid_node.engine_tls``) in front of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_testbed import Grid
from tlsfiles import make_ca

from grid_core.client import RequestRefused
from grid_server.harness import Child, start_engine_front, start_fake_engine

pytestmark = pytest.mark.integration

MODEL = "tls-model"
CHAT = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "ping"}]}


@pytest.fixture
def fronted(tmp_path: Path) -> Iterator[tuple[Child, str, Path, Path]]:
    """A FAKE engine behind a TLS front on 127.0.0.1: (front, key, CA, another CA)."""
    engine, key = start_fake_engine(tmp_path, MODEL)
    ca = make_ca(tmp_path / "ca")
    other = make_ca(tmp_path / "other", "other-ca")
    cert, cert_key = ca.issue(tmp_path / "certs", "engine", ["127.0.0.1"])
    front = None
    try:
        front = start_engine_front(
            tmp_path,
            engine.url,
            key,
            advertise_host="127.0.0.1",
            cert=cert,
            key=cert_key,
            ca=ca.cert_path,
        )
        yield front, key, ca.cert_path, other.cert_path
    finally:
        if front is not None:
            front.stop()
        engine.stop()


def test_proxy_verifies_the_engine_against_its_registered_ca(grid_process: Grid, fronted) -> None:
    grid = grid_process
    front, key, ca, other_ca = fronted
    assert front.url.startswith("https://127.0.0.1:")
    token = grid.node_token("host-tls")
    grid.register_host(token, "host-tls")
    grid.register_engine(token, "host-tls", MODEL, front.url, key, ca_pem=ca.read_text())
    grid.wait_ready(MODEL)
    ok = grid.http.post(grid.url + "/v1/chat/completions", json=CHAT)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] > 0
    nodes = grid.http.get(grid.url + "/nodes").text
    assert "BEGIN CERTIFICATE" not in nodes and key not in nodes

    # The same engine registered with a CA that did not issue its certificate: refused.
    grid.register_engine(token, "host-tls", MODEL, front.url, key, ca_pem=other_ca.read_text())
    bad = grid.http.post(grid.url + "/v1/chat/completions", json=CHAT)
    # The handshake fails before any byte of the request is sent: nothing reached the engine.
    assert bad.status_code == 503, bad.text
    assert bad.json()["error"]["code"] == "upstream_unreachable"


def test_a_name_the_engine_certificate_does_not_cover_is_refused(
    grid_process: Grid, fronted
) -> None:
    grid = grid_process
    front, key, ca, _ = fronted
    port = front.url.rsplit(":", 1)[1]
    token = grid.node_token("host-tls")
    grid.register_host(token, "host-tls")
    # 'localhost' reaches the same front, but the certificate covers only 127.0.0.1.
    grid.register_engine(
        token, "host-tls", MODEL, f"https://localhost:{port}", key, ca_pem=ca.read_text()
    )
    grid.wait_ready(MODEL)
    bad = grid.http.post(grid.url + "/v1/chat/completions", json=CHAT)
    assert bad.status_code == 503, bad.text
    assert bad.json()["error"]["code"] == "upstream_unreachable"


def test_malformed_or_misplaced_engine_ca_is_refused(grid: Grid) -> None:
    token = grid.node_token("host-ca")
    grid.register_host(token, "host-ca")
    with pytest.raises(RequestRefused, match="'engine_ca_pem' is not a PEM CA bundle") as bad:
        grid.register_engine(
            token, "host-ca", MODEL, "https://127.0.0.1:9", "k", ca_pem="not a certificate"
        )
    assert bad.value.status == 400
    with pytest.raises(RequestRefused, match="only for an https:// engine") as plain:
        grid.register_engine(
            token, "host-ca", MODEL, "http://127.0.0.1:9", "k", ca_pem="-----BEGIN CERT"
        )
    assert plain.value.status == 400
