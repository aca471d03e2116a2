"""What the CLI needs to talk to a server: URL and token resolution, one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from grid_core.errors import EXIT_RUNTIME_FAILURE, EXIT_USAGE, GridError
from grid_core.system import grid_home
from grid_core.wire import OPERATOR_HEADER
from grid_server.context import NO_DELAY
from grid_server.home import OPERATOR_TOKEN_FILE, SERVER_FILE
from grid_server.registry import is_loopback_host
from grid_server.serve import DEFAULT_HOST, DEFAULT_PORT

TOKEN_ENV = "GRID_ALLOCATOR_CONTROL_TOKEN"
CLI_TIMEOUT_S = 30.0
"""CLI requests: a tick on a large fleet takes well under this."""
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"


OPERATOR_INPUT_STATUSES = frozenset({400, 404, 409, 413, 422})
"""Refusals caused by what the operator sent (bad value, unknown name, conflict, too large):
the CLI exits 2 for these. Credential refusals (401/403), an unreachable server and 5xx are
environment or remote failures and exit 1 (see docs/operations.md, "Exit codes")."""


def exit_code_for(status: int) -> int:
    """The CLI exit code for an HTTP error ``status`` (2 operator input, 1 otherwise)."""
    return EXIT_USAGE if status in OPERATOR_INPUT_STATUSES else EXIT_RUNTIME_FAILURE


class CliError(GridError):
    """A CLI failure with its exit code (1 runtime, 2 usage)."""

    def __init__(
        self, message: str, exit_code: int = EXIT_RUNTIME_FAILURE, http_status: int | None = None
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.http_status = http_status
        """The server's HTTP status when the failure is a refused request, else None."""


def home_dir() -> Path:
    """``$GRID_HOME`` or ``~/.grid`` (not created: the CLI only reads it)."""
    return grid_home()


def local_server() -> dict[str, Any] | None:
    """The running local server's record (``server.json``), if any."""
    try:
        return json.loads((home_dir() / SERVER_FILE).read_text())
    except (OSError, ValueError):
        return None


def resolve_grid(grid: str | None) -> str:
    """Base URL for ``--grid`` (a URL, or ``local``/omitted for this machine's server).

    Raises:
        CliError: an unknown grid name (exit 2).
    """
    if grid and grid.startswith(("http://", "https://")):
        return grid.rstrip("/")
    if grid in (None, "", "local"):
        rec = local_server()
        return str(rec["url"]) if rec and rec.get("url") else DEFAULT_URL
    msg = f"--grid {grid!r}: give a URL such as http://127.0.0.1:22100, or 'local'"
    raise CliError(msg, EXIT_USAGE)


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


def _check_transport(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme == "http" and not is_loopback_host(parts.hostname or ""):
        msg = f"refusing to send the operator capability to {url} over plain HTTP; use https://"
        raise CliError(msg, EXIT_USAGE)


def request(
    method: str,
    grid: str | None,
    path: str,
    *,
    token_file: Path | None = None,
    operator: bool = False,
    body: object = None,
    params: dict[str, str] | None = None,
) -> Any:
    """Send one request and return the decoded JSON body.

    Raises:
        CliError: unreachable server (exit 1), a refused request (``exit_code_for``).
    """
    base = resolve_grid(grid)
    headers: dict[str, str] = {}
    if operator:
        _check_transport(base)
        headers[OPERATOR_HEADER] = operator_token(token_file)
    try:
        with httpx.Client(
            timeout=CLI_TIMEOUT_S,
            trust_env=False,
            transport=httpx.HTTPTransport(socket_options=NO_DELAY),
        ) as client:
            resp = client.request(
                method,
                base + path,
                headers=headers,
                params=params,
                content=None if body is None else json.dumps(body),
            )
    except httpx.HTTPError as exc:
        msg = f"no Grid server answered at {base} ({type(exc).__name__}); start one with 'grid up'"
        raise CliError(msg) from None
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.status_code >= 400:
        err = data.get("error") if isinstance(data, dict) else None
        message = err.get("message") if isinstance(err, dict) else resp.text[:200]
        code = exit_code_for(resp.status_code)
        raise CliError(f"{method} {path} → {resp.status_code}: {message}", code, resp.status_code)
    return data
