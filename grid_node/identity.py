"""Process identity proofs: a PID alone never authorises a signal.

A process is "proven" only when it is alive (not a zombie), its creation time equals the
recorded birth marker, its executable is the recorded one, and its command line carries the
recorded arguments (model path, alias, port for an engine child; the instance id for the
node daemon). PID reuse, a replaced binary or a process started by someone else all fail the
proof, and Grid then refuses to signal (specification, "Managed host actuator").
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Literal

import psutil

BIRTH_TOLERANCE_S = 0.05
"""psutil reports creation time with ~10 ms resolution; 50 ms absorbs rounding, far below the
time a PID needs to be recycled."""

ProofStatus = Literal["proven", "dead", "unproven"]


@dataclass(frozen=True)
class Proof:
    """Outcome of an identity check.

    Attributes:
        status: proven, dead (no such live process) or unproven (alive but not ours).
        reason: which field failed, for status and error messages.
    """

    status: ProofStatus
    reason: str = ""


def birth_of(pid: int) -> float | None:
    """The process creation time (seconds) or ``None`` when it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def exe_of(pid: int) -> str | None:
    """The resolved executable path of ``pid`` or ``None`` when unreadable."""
    try:
        return os.path.realpath(psutil.Process(pid).exe())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None


def _has_pair(cmdline: list[str], flag: str, value: str) -> bool:
    return any(cmdline[i] == flag and cmdline[i + 1] == value for i in range(len(cmdline) - 1))


def prove(
    pid: int,
    *,
    birth: float | None,
    executable: str | None = None,
    args: tuple[tuple[str, str], ...] = (),
) -> Proof:
    """Check that ``pid`` is exactly the process that was recorded.

    Args:
        pid: the recorded process id.
        birth: the recorded creation time; ``None`` means it was never recorded, which can
            never be proven.
        executable: the recorded resolved executable path, when part of the identity.
        args: ``(flag, value)`` pairs that must appear adjacent in the command line.

    Returns:
        The proof outcome; ``unproven`` names the first field that did not match.
    """
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return Proof("dead", f"pid {pid} has exited")
        created = proc.create_time()
        cmdline = proc.cmdline()
    except psutil.NoSuchProcess:
        return Proof("dead", f"pid {pid} does not exist")
    except (psutil.AccessDenied, psutil.ZombieProcess) as exc:
        return Proof("unproven", f"pid {pid} cannot be inspected: {type(exc).__name__}")
    if birth is None:
        return Proof("unproven", f"pid {pid} has no recorded birth marker")
    if abs(created - birth) > BIRTH_TOLERANCE_S:
        return Proof(
            "unproven", f"pid {pid} was born at {created:.2f}, not {birth:.2f} (the pid was reused)"
        )
    if executable is not None:
        exe = exe_of(pid)
        if exe != os.path.realpath(executable):
            return Proof("unproven", f"pid {pid} runs {exe!r}, not {executable!r}")
    for flag, value in args:
        if not _has_pair(cmdline, flag, value):
            return Proof("unproven", f"pid {pid} command line lacks {flag} {value}")
    return Proof("proven")


def signal_proven(pid: int, sig: signal.Signals, proof: Proof) -> None:
    """Send ``sig`` to ``pid`` only when ``proof`` says it is ours.

    Raises:
        grid_core.errors.ForbiddenError: the proof is not ``proven``.
    """
    from grid_core.errors import ForbiddenError

    if proof.status != "proven":
        msg = f"refusing to signal pid {pid}: identity not proven ({proof.reason})"
        raise ForbiddenError(msg)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def is_gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (absent or a zombie awaiting its parent)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False
