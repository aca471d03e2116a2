"""What the CLI needs to talk to a server: URL and token resolution, one-line errors.

Requests themselves go through the one typed client, :mod:`grid_core.client`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

from grid_core import grids
from grid_core.client import (
    OPERATOR_INPUT_STATUSES,
    Call,
    GridClient,
    check_credential_transport,
    exit_code_for,
)
from grid_core.errors import EXIT_RUNTIME_FAILURE, EXIT_USAGE, GridError
from grid_core.grids import GridTarget
from grid_core.system import grid_home
from grid_server.home import OPERATOR_TOKEN_FILE, SERVER_FILE

T = TypeVar("T")

TOKEN_ENV = "GRID_ALLOCATOR_CONTROL_TOKEN"
CLIENT_KEY_ENV = "GRID_API_KEY"
"""Environment variable that may carry a ``/v1`` client API key (else the grid's key file)."""
CLI_TIMEOUT_S = 30.0
"""CLI requests: a tick on a large fleet takes well under this."""
DEFAULT_URL = grids.DEFAULT_URL

__all__ = ["OPERATOR_INPUT_STATUSES", "CliError", "exit_code_for", "send"]


class CliError(GridError):
    """A CLI failure with its exit code (1 runtime, 2 usage)."""

    def __init__(
        self, message: str, exit_code: int = EXIT_RUNTIME_FAILURE, http_status: int | None = None
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        if http_status is not None:  # the server's status for a refused request
            self.http_status = http_status


def home_dir() -> Path:
    """``$GRID_HOME`` or ``~/.grid`` (not created: the CLI only reads it)."""
    return grid_home()


def local_server() -> dict[str, Any] | None:
    """The running local server's record (``server.json``), if any."""
    try:
        return json.loads((home_dir() / SERVER_FILE).read_text())
    except (OSError, ValueError):
        return None


def resolve_target(grid: str | None) -> GridTarget:
    """The grid ``--grid`` names (a URL, a configured name, ``local`` or omitted) with its CA
    and credential files (:func:`grid_core.grids.resolve_target`).

    Raises:
        ValidationError: an unknown grid name or a malformed URL (exit 2).
    """
    return grids.resolve_target(grid, home_dir())


def resolve_grid(grid: str | None) -> str:
    """Base URL for ``--grid`` (see :func:`resolve_target`).

    Raises:
        ValidationError: an unknown grid name or a malformed URL (exit 2).
    """
    return resolve_target(grid).url


def operator_token(token_file: Path | None) -> str:
    """The operator capability: ``--token-file``, then the env var, then ``$GRID_HOME``.

    Raises:
        CliError: none found, the file is unreadable or readable by others (exit 2).
    """
    if token_file is not None:
        try:
            _check_owner_only(token_file)
            return token_file.read_text().strip()
        except OSError as exc:
            msg = f"--token-file {token_file}: {exc.strerror}"
            raise CliError(msg, EXIT_USAGE) from None
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env
    path = home_dir() / OPERATOR_TOKEN_FILE
    try:
        _check_owner_only(path)
        return path.read_text().strip()
    except OSError:
        msg = (
            f"no operator capability: pass --token-file, set {TOKEN_ENV}, or run this on "
            f"the machine whose {path} the server created"
        )
        raise CliError(msg, EXIT_USAGE) from None


def _check_owner_only(path: Path) -> None:
    """Refuse a credential file others can read, as the server does for its own secrets.

    Raises:
        CliError: group/world permission bits are set (exit 2: the operator fixes the file).
        OSError: the file cannot be inspected.
    """
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        msg = f"{path} is readable by other users (mode {mode:o}); run 'chmod 600 {path}' and retry"
        raise CliError(msg, EXIT_USAGE)


def send(grid: str | None, call: Call[T], *, token_file: Path | None = None) -> T:
    """Send one control-API call to the grid the operator named and return its answer.

    The operator token is read only for calls that need it (so ``grid allocator status``
    works without one).

    Raises:
        RequestRefused: the server refused (exit 2 for operator input, else 1).
        ServerUnreachable: no server answered (exit 1).
        PlainHttpRefused: the token would cross the network over plain HTTP (exit 2).
        TlsRefused: the server's certificate failed verification (exit 1).
        CliError: no operator token could be found (exit 2).
    """
    target = resolve_target(grid)
    token = None
    if call.credential == "operator":
        check_credential_transport(target.url, "operator token")
        token = operator_token(token_file or target.token_file)
    with GridClient(
        target.url, operator_token=token, timeout=CLI_TIMEOUT_S, ca_file=target.ca_file
    ) as client:
        if call.path.startswith("/v1/"):
            client.client_key = client_key(target)
        client.start_hint = target.start_hint
        return client.send(call)


def client_key(target: GridTarget) -> str | None:
    """The ``/v1`` client API key: ``$GRID_API_KEY``, else the grid's ``client_key_file``.

    Raises:
        CliError: the key file is unreadable or readable by others (exit 2).
    """
    env = os.environ.get(CLIENT_KEY_ENV, "").strip()
    if env:
        return env
    path = target.client_key_file
    if path is None:
        return None
    try:
        _check_owner_only(path)
        return path.read_text().strip() or None
    except OSError as exc:
        raise CliError(f"client key file {path}: {exc.strerror}", EXIT_USAGE) from None
