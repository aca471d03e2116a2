"""Process identity: a PID alone never authorises a signal.

A recorded process is *proven* only when it is alive (not a zombie), its creation time matches
the recorded birth marker within :data:`BIRTH_TOLERANCE_S`, its executable is the recorded one
and its command line carries the recorded arguments (or equals the recorded command line).
PID reuse, a replaced binary or a process started by someone else all fail the proof, and Grid
then refuses to signal (specification, "Managed host actuator").
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import psutil

from grid_core.errors import ForbiddenError

BIRTH_TOLERANCE_S = 0.05
"""Seconds two readings of one process's creation time may differ. Linux derives it from
boot time plus clock ticks (10 ms), so readings of one process agree to well under 50 ms,
while a recycled PID needs far longer than that to come around again."""

ProofStatus = Literal["proven", "dead", "unproven"]


@dataclass(frozen=True)
class Proof:
    """Outcome of an identity check.

    Attributes:
        status: ``proven``, ``dead`` (no such live process) or ``unproven`` (alive, not ours).
        reason: which field failed, for status documents and error messages.
    """

    status: ProofStatus
    reason: str = ""


class Provable(Protocol):
    """Anything that names one process and can prove it is still that process."""

    @property
    def pid(self) -> int: ...

    def prove(self) -> Proof: ...


def birth_of(pid: int) -> float | None:
    """The creation time of ``pid`` (seconds since the epoch), or ``None`` when unreadable."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return None


def exe_of(pid: int) -> str | None:
    """The resolved executable path of ``pid``, or ``None`` when unreadable."""
    try:
        exe = psutil.Process(pid).exe()
    except (psutil.Error, OSError, ValueError):
        return None
    # An exiting process (killed, not yet a zombie) has no executable link any more: psutil
    # answers "", which realpath would turn into the current directory.
    return os.path.realpath(exe) if exe else None


def same_birth(pid: int, birth: float | None) -> bool:
    """Whether ``pid`` is alive with creation time ``birth`` (within the one tolerance)."""
    got = birth_of(pid)
    return got is not None and birth is not None and abs(got - birth) <= BIRTH_TOLERANCE_S


def _has_pair(cmdline: Sequence[str], flag: str, value: str) -> bool:
    return any(cmdline[i] == flag and cmdline[i + 1] == value for i in range(len(cmdline) - 1))


@dataclass(frozen=True)
class ProcessIdentity:
    """What Grid recorded about a process it started, enough to prove it later.

    Attributes:
        pid: the process id.
        birth: creation time in seconds since the epoch (psutil ``create_time``); ``None``
            means it was never recorded, which can never be proven.
        executable: the resolved executable path, when part of the identity.
        args: ``(flag, value)`` pairs that must stand adjacent in the command line.
        cmdline: the exact command line, when recorded whole.
    """

    pid: int
    birth: float | None
    executable: str | None = None
    args: tuple[tuple[str, str], ...] = ()
    cmdline: tuple[str, ...] | None = None

    @classmethod
    def of_current(cls) -> ProcessIdentity:
        """This process's own identity (birth and exact command line), to be recorded."""
        me = psutil.Process()
        return cls(pid=me.pid, birth=me.create_time(), cmdline=tuple(me.cmdline()))

    def prove(self) -> Proof:
        """Check that :attr:`pid` still names exactly the recorded process.

        Returns:
            The proof; ``unproven`` names the first field that did not match.
        """
        pid = self.pid
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
        if self.birth is None:
            return Proof("unproven", f"pid {pid} has no recorded birth marker")
        if abs(created - self.birth) > BIRTH_TOLERANCE_S:
            return Proof(
                "unproven",
                f"pid {pid} was born at {created:.2f}, not {self.birth:.2f} (the pid was reused)",
            )
        if self.executable is not None:
            exe = exe_of(pid)
            if exe is None and not cmdline:
                # Same birth, so the same process, and its memory is already released: it is
                # exiting (after SIGKILL, before it becomes a zombie).
                return Proof("dead", f"pid {pid} is exiting")
            if exe != os.path.realpath(self.executable):
                return Proof("unproven", f"pid {pid} runs {exe!r}, not {self.executable!r}")
        if self.cmdline is not None and tuple(cmdline) != self.cmdline:
            return Proof("unproven", f"pid {pid} has another command line than recorded")
        for flag, value in self.args:
            if not _has_pair(cmdline, flag, value):
                return Proof("unproven", f"pid {pid} command line lacks {flag} {value}")
        return Proof("proven")


def prove(
    pid: int,
    *,
    birth: float | None,
    executable: str | None = None,
    args: tuple[tuple[str, str], ...] = (),
) -> Proof:
    """Shorthand for ``ProcessIdentity(pid, birth, executable, args).prove()``."""
    return ProcessIdentity(pid, birth, executable, args).prove()


@dataclass(frozen=True)
class SpawnedChild:
    """A child this process spawned and has not yet reaped.

    Until its exit status is collected the kernel cannot hand its PID to another process, so
    being our unreaped child is itself the proof (used between spawn and the first record of
    its birth marker).

    Attributes:
        pid: the child's process id.
    """

    pid: int

    def prove(self) -> Proof:
        """``proven`` while the child runs, ``dead`` once it exited (it is reaped here)."""
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return Proof("dead", f"pid {self.pid} is not (or no longer) a child of this process")
        if done:
            return Proof("dead", f"pid {self.pid} has exited")
        return Proof("proven")


def signal_proven(pid: int, sig: signal.Signals, proof: Proof) -> None:
    """Send ``sig`` to ``pid`` only when ``proof`` says the process is ours.

    Raises:
        ForbiddenError: the proof is not ``proven`` (nothing is signalled).
    """
    if proof.status != "proven":
        msg = f"refusing to signal pid {pid}: identity not proven ({proof.reason})"
        raise ForbiddenError(msg)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def exit_status(pid: int) -> int | None:
    """Reap ``pid`` if it is an exited child of this process and return how it ended.

    Returns:
        The exit code (negative signal number when killed by a signal, as ``Popen`` does), or
        ``None`` while it runs or when it is not a child of this process (its own parent
        reaps it).
    """
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if done else None


def reap(pid: int) -> bool:
    """Whether ``pid`` was an exited child of this process, now reaped (see :func:`exit_status`)."""
    return exit_status(pid) is not None


def is_gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (absent, or a zombie awaiting its parent)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False
