"""Detached spawn: start a process that outlives its starter, logging to a file.

The child gets its own session (so a terminal's Ctrl-C or the starter's exit does not reach
it), stdin from ``/dev/null`` and stdout/stderr appended to an owner-only log file. Secrets
never travel in argv; environment variables that carry credentials are dropped unless the
caller passes them on purpose.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

SECRET_ENV_PREFIXES = ("GRID_ALLOCATOR_", "GRID_ENGINE_")
"""Environment variables holding credentials (operator, node and engine tokens): an engine
child or test server never needs them, so they are never inherited by default."""
SAFE_PATH_FLAG = "-P"
"""Python flag for every Grid daemon started as ``python -m …``: without it the working
directory comes first on the import path, so a server or agent started from a directory that
holds another copy of Grid (an old checkout) would run that copy instead of the installed one."""
LOG_MODE = 0o600
"""Logs can quote request paths and model ids: readable by the owner only."""


def scrubbed_env(
    base: Mapping[str, str] | None = None,
    *,
    drop_prefixes: tuple[str, ...] = SECRET_ENV_PREFIXES,
    **extra: str,
) -> dict[str, str]:
    """A child environment without credential variables.

    Args:
        base: the environment to start from (default ``os.environ``).
        drop_prefixes: variable-name prefixes that are removed.
        extra: variables set on top (e.g. ``GRID_HOME``).

    Returns:
        The new environment mapping.
    """
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith(drop_prefixes)
    }
    env.update(extra)
    return env


def spawn_detached(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    truncate_log: bool = False,
    new_session: bool = True,
) -> int:
    """Start ``argv`` as a detached child and return its PID.

    ``posix_spawn`` rather than ``subprocess.Popen``: the child is meant to outlive the
    object (and often the process) that started it; a later Grid process stops it by proven
    identity, and an exited child is reaped by PID (:func:`grid_core.system.identity.reap`).

    Args:
        argv: the command line; ``argv[0]`` is the executable path.
        log_path: file that receives stdout and stderr (created with mode 0600).
        env: the child's environment (default: :func:`scrubbed_env` of ours).
        truncate_log: start the log afresh instead of appending (an error quoting its tail
            then shows only this run's lines).
        new_session: give the child its own session and process group (default); False
            keeps it in ours, so a terminal's Ctrl-C reaches it too.

    Returns:
        The child's PID.

    Raises:
        OSError: the log cannot be opened or the executable cannot be started.
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate_log else os.O_APPEND)
    fd = os.open(log_path, flags, LOG_MODE)
    try:
        return os.posix_spawn(
            argv[0],
            list(argv),
            dict(scrubbed_env() if env is None else env),
            setsid=new_session,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
        )
    finally:
        os.close(fd)
