"""Durable atomic file writes.

A write goes to a temp file in the target's directory (created with the final mode, so a secret
never exists with wider permissions), is fsynced, renamed over the target, and the directory
is fsynced; after a crash a reader finds the old content or the new, never a mix, and the
rename itself survives power loss.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from grid_core.errors import StateError

OWNER_ONLY = 0o600
"""Default file mode: Grid's state files hold credentials or authority records."""


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry change (a rename or create) to disk.

    Raises:
        OSError: the directory cannot be opened.
    """
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(src: Path, dst: Path) -> None:
    """Publish a finished file: flush ``src``, rename it over ``dst``, flush the directory.

    For content written by other code (a download, a build, a generated model) into a temp
    file beside ``dst``; :func:`write_atomic` covers content held in memory.

    Raises:
        OSError: the flush or the rename failed (``dst`` is then unchanged).
    """
    fd = os.open(src, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(src, dst)
    fsync_dir(dst.parent)


def write_atomic(path: Path, data: bytes | str, *, mode: int = OWNER_ONLY) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    Args:
        path: the target file; its directory must exist.
        data: the new content (``str`` is encoded as UTF-8).
        mode: permission bits of the new file (``0o600`` unless the content is public).

    Raises:
        StateError: the write failed; the previous file is untouched and no temp file is
            left behind. The message names the file and the likely fix.
    """
    payload = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)  # the umask must not widen or narrow the requested mode
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        replace_durably(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        msg = (
            f"cannot write {path}: {exc.strerror or exc}; check that its directory exists "
            "and is writable by this user"
        )
        raise StateError(msg) from exc
