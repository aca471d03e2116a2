"""Graceful stop by proven identity: SIGTERM, a bounded wait, then SIGKILL.

Every signal is preceded by a fresh identity proof, so a process that exited and whose PID was
reused in the meantime is never signalled. An exited child of this process is reaped while
waiting, so no zombie is left behind.
"""

from __future__ import annotations

import signal
from collections.abc import Generator
from typing import Literal

from grid_core.errors import UnavailableError
from grid_core.system.identity import Provable, is_gone, reap, signal_proven
from grid_core.system.poll import wait_until, wait_until_sync

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


def _signal(target: Provable, sig: signal.Signals) -> bool:
    """Prove afresh, then send ``sig``; False when the process has already exited."""
    proof = target.prove()
    if proof.status == "dead":
        reap(target.pid)
        return False
    signal_proven(target.pid, sig, proof)
    return True


def _sequence(
    target: Provable, grace_s: float, escalate: bool
) -> Generator[float, bool | None, StopOutcome]:
    """The stop protocol, shared by both drivers: yields wait budgets, receives "exited?"."""
    if not _signal(target, signal.SIGTERM):
        return "gone"
    if (yield grace_s):
        return "terminated"
    if not escalate:
        return "running"
    if not _signal(target, signal.SIGKILL):
        return "terminated"
    if (yield KILL_WAIT_S):
        return "killed"
    msg = f"pid {target.pid} did not exit {KILL_WAIT_S:.0f} s after SIGKILL; inspect it by hand"
    raise UnavailableError(msg)


class _Run:
    """One stop in progress: drives :func:`_sequence`; the caller performs each wait."""

    def __init__(self, target: Provable, grace_s: float, escalate: bool) -> None:
        self.pid = target.pid
        self._steps = _sequence(target, grace_s, escalate)
        self._outcome: StopOutcome | None = None
        self.budget: float | None = self._advance(None)

    def _advance(self, exited: bool | None) -> float | None:
        try:
            return self._steps.send(exited)  # the first send (None) starts it
        except StopIteration as done:
            self._outcome = done.value
            return None

    def exited(self) -> bool:
        return _exited(self.pid)

    def waited(self, exited: bool | None) -> None:
        self.budget = self._advance(bool(exited))

    def outcome(self) -> StopOutcome:
        assert self._outcome is not None  # only read after the last wait
        return self._outcome


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
    run = _Run(target, grace_s, escalate)
    while run.budget is not None:
        run.waited(await wait_until(run.exited, timeout_s=run.budget, interval_s=STOP_POLL_S))
    return run.outcome()


def stop_process_sync(target: Provable, *, grace_s: float, escalate: bool = True) -> StopOutcome:
    """Blocking twin of :func:`stop_process` for synchronous callers (CLI commands) only.

    Same arguments (seconds), outcome and errors (``ForbiddenError`` when unproven,
    ``UnavailableError`` when it outlives SIGKILL) as :func:`stop_process`.
    """
    run = _Run(target, grace_s, escalate)
    while run.budget is not None:
        run.waited(wait_until_sync(run.exited, timeout_s=run.budget, interval_s=STOP_POLL_S))
    return run.outcome()
