"""Operator capability and host-scoped node credentials (files 0600, scope, expiry)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from grid_core.errors import AuthError, ForbiddenError, StateError
from grid_server.auth import Credentials
from grid_server.home import OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE

NOW = 1_800_000_000.0


def test_secret_files_are_created_owner_only(tmp_path: Path) -> None:
    Credentials(tmp_path)
    for name in (OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


def test_secrets_persist_across_restarts(tmp_path: Path) -> None:
    token = Credentials(tmp_path).issue_node("h1", NOW)
    assert Credentials(tmp_path).verify_node(token, NOW).host_id == "h1"


def test_world_readable_secret_is_refused(tmp_path: Path) -> None:
    Credentials(tmp_path)
    (tmp_path / SIGNING_KEY_FILE).chmod(0o644)
    with pytest.raises(StateError, match="chmod 600"):
        Credentials(tmp_path)


def test_operator_check(tmp_path: Path) -> None:
    creds = Credentials(tmp_path)
    good = (tmp_path / OPERATOR_TOKEN_FILE).read_text().strip()
    creds.check_operator(good)
    for bad in (None, "", "x", good + "x"):
        with pytest.raises(AuthError):
            creds.check_operator(bad)


def test_node_credential_scope_and_expiry(tmp_path: Path) -> None:
    creds = Credentials(tmp_path)
    token = creds.issue_node("host-a", NOW, ttl_s=60)
    claims = creds.verify_node(token, NOW + 59)
    creds.require_host(claims, "host-a")
    with pytest.raises(ForbiddenError, match="host-a"):
        creds.require_host(claims, "host-b")
    with pytest.raises(AuthError, match="expired"):
        creds.verify_node(token, NOW + 60)


def test_forged_or_foreign_credentials_are_refused(tmp_path: Path) -> None:
    creds = Credentials(tmp_path / "one")
    other = Credentials(tmp_path / "two")
    token = creds.issue_node("h", NOW)
    with pytest.raises(AuthError):
        other.verify_node(token, NOW)
    payload, sig = token.rsplit(".", 1)
    with pytest.raises(AuthError):
        creds.verify_node(payload + "." + sig[::-1], NOW)
    with pytest.raises(AuthError):
        creds.verify_node(None, NOW)


def test_refused_operator_names_the_token_file_this_server_reads(tmp_path: Path) -> None:
    # A test fleet's server keeps its home below $GRID_HOME/fleet/server, not $GRID_HOME:
    # the 401 must send the operator to the file that actually holds the token.
    server_home = tmp_path / "fleet" / "server"
    creds = Credentials(server_home)
    token_file = str(server_home / OPERATOR_TOKEN_FILE)
    for bad in (None, "wrong"):
        with pytest.raises(AuthError) as refused:
            creds.check_operator(bad)
        assert token_file in str(refused.value)
        assert "$GRID_HOME/operator-token" not in str(refused.value)
