"""Client API keys for ``/v1`` over real TLS on loopback (certificates from ``grid tls init``):
a server that requires keys refuses ``/v1`` without a valid one, keys are shown once, stored
hashed and never appear in status, ``/nodes``, the key list or the server's log."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grid_core.client import tls_verify
from grid_core.system import wait_until_sync
from grid_server.harness import Child, Testbed, fake_engine_in_thread, start_server
from grid_server.serve import client_keys_required

pytestmark = pytest.mark.integration

GRID_BIN = Path(sys.executable).parent / "grid"
MODEL = "keyed-model.gguf"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def grid_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    return subprocess.run(
        [str(GRID_BIN), *args], env=env, capture_output=True, text=True, timeout=90, check=False
    )


class KeyedGrid:
    def __init__(self, child: Child, home: Path, bed: Testbed) -> None:
        self.child, self.home, self.bed = child, home, bed

    def v1(self, path: str, key: str | None, body: object | None = None) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"} if key is not None else {}
        url = self.child.url + path
        if body is None:
            return self.bed.http.get(url, headers=headers)
        return self.bed.http.post(url, headers=headers, json=body)


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[KeyedGrid]:
    pki = tmp_path / "pki"
    assert grid_cli("tls", "init", str(pki), home=tmp_path / "cli").returncode == 0
    home = tmp_path / "home"
    child = start_server(
        home,
        extra_args=[
            "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server-key.pem"),
            "--tls-ca", str(pki / "ca.pem"), "--client-keys", "required",
        ],
    )  # fmt: skip
    bed = Testbed(child.url, home, http=httpx.Client(timeout=30, verify=tls_verify(pki / "ca.pem")))
    engine, engine_key = fake_engine_in_thread(MODEL)
    try:
        token = bed.node_token("host-keyed")
        bed.register_host(token, "host-keyed")
        bed.register_engine(token, "host-keyed", MODEL, engine.url, engine_key)
        yield KeyedGrid(child, home, bed)
    finally:
        engine.stop()
        bed.close()
        child.stop()


def test_v1_without_a_valid_client_key_is_refused(keyed: KeyedGrid) -> None:
    for key in (None, "gk-not-a-key", "x" * 5000):
        r = keyed.v1("/v1/models", key)
        assert r.status_code == 401, (key, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and "client API key" in err["message"]
    r = keyed.v1("/v1/chat/completions", None, CHAT)
    assert r.status_code == 401
    # Control routes are unaffected (they have their own credentials).
    assert keyed.bed.http.get(keyed.child.url + "/allocator/status").status_code == 200


def test_created_key_is_shown_once_stored_hashed_and_revocable(keyed: KeyedGrid) -> None:
    made = grid_cli("keys", "create", "team-research", home=keyed.home)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("gk-") and "shown once" in made.stderr

    def listed() -> bool:
        return keyed.v1("/v1/models", key).status_code == 200

    assert wait_until_sync(listed, timeout_s=10, interval_s=0.1)
    assert MODEL in [m["id"] for m in keyed.v1("/v1/models", key).json()["data"]]
    chat = keyed.v1("/v1/chat/completions", key, CHAT)
    assert chat.status_code == 200, chat.text

    stored = (keyed.home / "client-keys.json").read_text()
    assert key not in stored and (keyed.home / "client-keys.json").stat().st_mode & 0o777 == 0o600
    listing = grid_cli("keys", "list", "--json", home=keyed.home)
    status = grid_cli("allocator", "status", "--json", home=keyed.home)
    nodes = keyed.bed.http.get(keyed.child.url + "/nodes").text
    for text in (listing.stdout, status.stdout, nodes, keyed.child.log.read_text()):
        assert key not in text and key[3:] not in text
    assert '"team-research"' in listing.stdout and '"required": true' in listing.stdout

    again = grid_cli("keys", "create", "team-research", home=keyed.home)
    assert again.returncode == 2 and "exists" in again.stderr  # one name, one key

    assert grid_cli("keys", "revoke", "team-research", home=keyed.home).returncode == 0
    r = keyed.v1("/v1/chat/completions", key, CHAT)
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def test_chat_cli_sends_the_key_from_the_environment(keyed: KeyedGrid) -> None:
    key = grid_cli("keys", "create", "cli-user", home=keyed.home).stdout.strip()
    refused = grid_cli("chat", "-m", MODEL, "hello", "--max-tokens", "4", home=keyed.home)
    assert refused.returncode == 1 and "client API key" in refused.stderr
    env_home = {**os.environ, "GRID_HOME": str(keyed.home), "GRID_API_KEY": key}
    ok = subprocess.run(
        [str(GRID_BIN), "chat", "-m", MODEL, "hello", "--max-tokens", "4"],
        env=env_home, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr


def test_keys_are_required_by_default_only_off_loopback() -> None:
    assert client_keys_required("127.0.0.1", None) is False
    assert client_keys_required("::1", None) is False
    assert client_keys_required("0.0.0.0", None) is True
    assert client_keys_required("198.18.0.1", None) is True
    assert client_keys_required("0.0.0.0", "open") is False
    assert client_keys_required("127.0.0.1", "required") is True
