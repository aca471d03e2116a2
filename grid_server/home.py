"""Where the server keeps its files: ``$GRID_HOME`` (default ``~/.grid``).

Layout::

    $GRID_HOME/operator-token        operator capability (0600)
    $GRID_HOME/signing-key           key that signs node credentials (0600)
    $GRID_HOME/state/controller.json controller state (written by the file state store)
    $GRID_HOME/server.json           url, pid, process birth time and state store of the
                                     running server
"""

from __future__ import annotations

import secrets
from pathlib import Path

from grid_core.errors import StateError
from grid_core.system import OWNER_ONLY, write_atomic
from grid_core.system import grid_home as _toolkit_home

OPERATOR_TOKEN_FILE = "operator-token"
SIGNING_KEY_FILE = "signing-key"
SERVER_FILE = "server.json"
STATE_DIR = "state"
SECRET_BYTES = 32
"""256-bit secrets: far beyond guessing, short enough to paste when an operator must."""


def grid_home(explicit: str | Path | None = None) -> Path:
    """The Grid home directory for the server (created owner-only when missing).

    Raises:
        StateError: the directory cannot be created (the message names it and the fix).
    """
    try:
        return _toolkit_home(explicit, create=True)
    except OSError as exc:
        msg = (
            f"cannot create the Grid home {exc.filename or _toolkit_home(explicit)}: "
            f"{exc.strerror}; point GRID_HOME at a directory you can write"
        )
        raise StateError(msg) from None


def write_secret_file(path: Path, content: str) -> None:
    """Create ``path`` owner-only (0600) with ``content``, atomically and durably.

    Raises:
        StateError: the file could not be written.
    """
    write_atomic(path, content, mode=OWNER_ONLY)


def read_or_create_secret(path: Path) -> str:
    """The secret stored in ``path``; a new random one is created (0600) when missing.

    Raises:
        StateError: the file exists but is readable by others, or cannot be read.
    """
    if not path.exists():
        write_secret_file(path, secrets.token_urlsafe(SECRET_BYTES) + "\n")
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            msg = (
                f"{path} is readable by other users (mode {mode:o}); "
                f"run 'chmod 600 {path}' and retry"
            )
            raise StateError(msg)
        value = path.read_text().strip()
    except OSError as exc:
        msg = f"cannot read {path}: {exc.strerror}"
        raise StateError(msg) from None
    if not value:
        msg = f"{path} is empty; delete it so a new secret is generated"
        raise StateError(msg)
    return value
