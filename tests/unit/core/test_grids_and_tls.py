"""``--grid`` resolution order and the TLS helpers' input checks (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grid_core.client import GridClient, ServerUnreachable, plain_http_refusal
from grid_core.errors import ValidationError
from grid_core.grids import (
    GridEntry,
    GridsConfig,
    load_config,
    register,
    resolve_target,
    save_config,
    unregister,
)
from grid_core.tls import TlsError, init_tls, normalize_fingerprint, parse_san


def test_resolution_order_url_name_default_local(tmp_path: Path) -> None:
    (tmp_path / "server.json").write_text(
        json.dumps({"url": "https://127.0.0.1:23000", "ca_file": "/pki/ca.pem"})
    )
    assert resolve_target(None, tmp_path).url == "https://127.0.0.1:23000"
    assert resolve_target("local", tmp_path).ca_file == Path("/pki/ca.pem")
    office = GridEntry(url="https://grid.lan:22100", ca_file="/o/ca.pem", token_file="/o/tok")
    save_config(GridsConfig(default="office", grids={"office": office}), tmp_path)
    default = resolve_target(None, tmp_path)
    assert (default.name, default.url) == ("office", "https://grid.lan:22100")
    # A bare URL picks up the configured grid's files; the local server's CA for its own URL.
    assert resolve_target("https://grid.lan:22100/", tmp_path).token_file == Path("/o/tok")
    assert resolve_target("https://127.0.0.1:23000", tmp_path).ca_file == Path("/pki/ca.pem")
    assert resolve_target("https://other.lan:1", tmp_path).ca_file is None
    with pytest.raises(ValidationError, match="no such grid"):
        resolve_target("lab", tmp_path)
    with pytest.raises(ValidationError, match="give https://host:port"):
        resolve_target("https://grid.lan:22100/v1", tmp_path)


def test_a_tool_registered_grid_brings_its_token_and_restart_command(tmp_path: Path) -> None:
    """The test fleet names itself: a bare URL finds its token, and a server that does not
    answer is met with the fleet's own restart command instead of 'grid up'."""
    save_config(GridsConfig(default="office", grids={}), tmp_path)
    fleet = GridEntry(url="http://127.0.0.1:1", token_file="/f/tok", start_hint="grid test restart")
    register("test-fleet", fleet, tmp_path)
    target = resolve_target("http://127.0.0.1:1", tmp_path)
    assert (target.name, target.token_file) == ("test-fleet", Path("/f/tok"))
    assert load_config(tmp_path).default == "office"  # the operator's default is untouched
    with GridClient(target.url, timeout=1.0) as client:
        client.start_hint = target.start_hint
        with pytest.raises(ServerUnreachable, match="bring it back with 'grid test restart'"):
            client.status()
    # Another grid re-using the name is left alone; the fleet's own entry is removed.
    assert not unregister("test-fleet", "http://127.0.0.1:2", tmp_path)
    assert unregister("test-fleet", "http://127.0.0.1:1", tmp_path)
    assert "test-fleet" not in load_config(tmp_path).grids
    assert resolve_target("http://127.0.0.1:1", tmp_path).start_hint == "grid up"


def test_the_server_side_transport_rule() -> None:
    assert plain_http_refusal("https", "198.18.0.7") is None
    assert plain_http_refusal("http", "127.0.0.1") is None
    assert plain_http_refusal("http", "::1") is None
    refusal = plain_http_refusal("http", "198.18.0.7")
    assert refusal is not None and "plain HTTP" in refusal
    assert plain_http_refusal("http", None) is not None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("grid.lan", "grid.lan"),
        ("GRID.Lan", "grid.lan"),
        ("[::1]", "::1"),
        ("198.18.0.1", "198.18.0.1"),
    ],
)
def test_san_accepts_hostnames_and_ip_literals(text: str, value: str) -> None:
    assert parse_san(text) == value


@pytest.mark.parametrize("text", ["", "bad name", "a..b", "x" * 64 + ".lan", "-/"])
def test_san_refuses_what_is_neither(text: str) -> None:
    with pytest.raises(ValidationError):
        parse_san(text)


def test_fingerprint_forms_normalize() -> None:
    hexits = "ab" * 32
    assert normalize_fingerprint("sha256:" + ":".join(["AB"] * 32)) == hexits
    with pytest.raises(ValidationError):
        normalize_fingerprint("sha256:abc")


def test_tls_init_writes_nothing_for_a_bad_san_and_never_overwrites(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        init_tls(tmp_path / "pki", ["bad name"])
    assert not (tmp_path / "pki").exists()
    init_tls(tmp_path / "pki", ["grid.lan"])
    before = (tmp_path / "pki" / "ca.pem").read_bytes()
    with pytest.raises(TlsError, match="already holds a CA"):
        init_tls(tmp_path / "pki", ["grid.lan"])
    assert (tmp_path / "pki" / "ca.pem").read_bytes() == before
