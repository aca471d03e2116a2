"""Where the server keeps its files: ``$GRID_HOME`` (default ``~/.grid``).

Layout::

    $GRID_HOME/operator-token        operator capability (0600)
    $GRID_HOME/signing-key           key that signs node credentials (0600)
    $GRID_HOME/state/controller.json controller state (written by the file state store)
    $GRID_HOME/server.json           url, pid and process birth time of the running server
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from grid_core.errors import StateError

HOME_ENV = "GRID_HOME"
OPERATOR_TOKEN_FILE = "operator-token"
SIGNING_KEY_FILE = "signing-key"
SERVER_FILE = "server.json"
STATE_DIR = "state"
SECRET_BYTES = 32
"""256-bit secrets: far beyond guessing, short enough to paste when an operator must."""
OWNER_ONLY = 0o600


def grid_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The Grid home directory (created owner-only when missing)."""
    raw = explicit or os.environ.get(HOME_ENV) or Path.home() / ".grid"
    path = Path(raw).expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_secret_file(path: Path, content: str) -> None:
    """Create ``path`` with mode 0600 before any byte of ``content`` is written.

    Replaces an existing file atomically (temp file in the same directory, then rename), so a
    reader never sees a half-written secret and the secret never exists with wider permissions.

    Raises:
        StateError: the file could not be written.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, OWNER_ONLY)
        try:
            os.write(fd, content.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, OWNER_ONLY)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        msg = f"cannot write secret file {path}: {exc.strerror}; check the directory permissions"
        raise StateError(msg) from None


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
