"""Graceful stop by proven identity: SIGTERM, a bounded wait, then SIGKILL.

Every signal is preceded by a fresh identity proof, so a process that exited and whose PID was
reused in the meantime is never signalled. An exited child of this process is reaped while
waiting, so no zombie is left behind.
"""

from __future__ import annotations

import functools
import signal
from typing import Literal

import anyio

from grid_core.errors import UnavailableError
from grid_core.system.identity import Provable, is_gone, reap, signal_proven
from grid_core.system.poll import wait_until

StopOutcome = Literal["gone", "terminated", "killed", "running"]
"""``gone``: it had already exited; ``terminated``: it exited after SIGTERM; ``killed``: it
needed SIGKILL; ``running``: it outlived the grace period and escalation was not allowed."""

KILL_WAIT_S = 5.0
"""Seconds to wait for the exit after SIGKILL: the kernel ends a killed process at once, so
only a process stuck in uninterruptible I/O (a hung disk or NFS) takes longer."""
STOP_POLL_S = 0.05
"""Seconds between exit checks while stopping: short, so a stop returns promptly."""


def _exited(pid: int) -> bool:
    return reap(pid) or is_gone(pid)


def _begin(target: Provable) -> bool:
    """Prove and send SIGTERM; False when the process is already gone."""
    proof = target.prove()
    if proof.status == "dead":
        reap(target.pid)
        return False
    signal_proven(target.pid, signal.SIGTERM, proof)
    return True


def _escalate(target: Provable) -> bool:
    """Re-prove and send SIGKILL; False when the process exited meanwhile."""
    proof = target.prove()
    if proof.status == "dead":
        reap(target.pid)
        return False
    signal_proven(target.pid, signal.SIGKILL, proof)
    return True


async def stop_process(target: Provable, *, grace_s: float, escalate: bool = True) -> StopOutcome:
    """Stop a proven process without blocking the event loop.

    Args:
        target: the process and how to prove it (a :class:`ProcessIdentity` or a
            :class:`SpawnedChild`).
        grace_s: seconds between SIGTERM and SIGKILL.
        escalate: send SIGKILL after ``grace_s``; when False the process is left running and
            ``running`` is returned.

    Returns:
        How the process ended (see :data:`StopOutcome`).

    Raises:
        ForbiddenError: the identity is not proven (nothing was signalled).
        UnavailableError: the process outlived SIGKILL by :data:`KILL_WAIT_S`.
    """
    if not _begin(target):
        return "gone"
    pid = target.pid
    if await wait_until(lambda: _exited(pid), timeout_s=grace_s, interval_s=STOP_POLL_S):
        return "terminated"
    if not escalate:
        return "running"
    if not _escalate(target):
        return "terminated"
    if await wait_until(lambda: _exited(pid), timeout_s=KILL_WAIT_S, interval_s=STOP_POLL_S):
        return "killed"
    msg = f"pid {pid} did not exit {KILL_WAIT_S:.0f} s after SIGKILL; inspect it by hand"
    raise UnavailableError(msg)


def stop_process_sync(target: Provable, *, grace_s: float, escalate: bool = True) -> StopOutcome:
    """Blocking twin of :func:`stop_process` for synchronous callers (CLI commands) only.

    It runs :func:`stop_process` in a fresh event loop, so it must not be called from async
    code (anyio raises ``RuntimeError`` there).

    Args:
        target: the process and how to prove it.
        grace_s: seconds between SIGTERM and SIGKILL.
        escalate: send SIGKILL after ``grace_s``; when False ``running`` may be returned.

    Returns:
        How the process ended (see :data:`StopOutcome`).

    Raises:
        ForbiddenError: the identity is not proven (nothing was signalled).
        UnavailableError: the process outlived SIGKILL by :data:`KILL_WAIT_S`.
    """
    return anyio.run(functools.partial(stop_process, target, grace_s=grace_s, escalate=escalate))
