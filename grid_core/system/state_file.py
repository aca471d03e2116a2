"""The controller's durable file state and its single-writer lease file (the embedded store).

It lives in the host-OS toolkit because it is pure host mechanics (files, an OS file lock, the
holder's process identity) behind the :class:`grid_core.store.StateStore` interface: the Grid
server uses it for ``$GRID_HOME/state``, and tools that embed a controller (the scenario lab,
``grid bench tick``) get it through :mod:`grid_core.api`.

``$GRID_HOME/state/controller.json`` holds the controller document; it is replaced
atomically (temp file in the same directory, fsync, rename, directory fsync), so a crash
leaves either the old or the new state. Beside it, ``controller.json.lease`` records which
controller may mutate the fleet (holder id, term, expiry, and the holder's host, PID and
process birth time). Read-modify-write of the lease happens under an OS file lock
(``filelock``), so two servers sharing the directory cannot both take it.

Specification, "Local wire contract" (renewable single-writer lease beside the state file,
term increments on every takeover) and "HTTP control surface" (atomic writes, quarantine).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from pathlib import Path

import msgspec
from filelock import FileLock, Timeout

from grid_core.errors import ConflictError, StateError
from grid_core.store import LeaseHolder, check_expected
from grid_core.system import birth_of, replace_durably, same_birth, write_atomic

LOCK_TIMEOUT_S = 5.0
"""Longest wait for the lease file lock: a lease update takes milliseconds, so a longer wait
means another process is stuck holding it and the caller should fail rather than hang."""


class LeaseRecord(msgspec.Struct, kw_only=True):
    """Contents of the lease file.

    Attributes:
        holder: controller id holding mutation authority.
        term: increases on every takeover (never on renewal).
        expires_at: wall-clock seconds when the authority lapses unless renewed.
        hostname / pid / birth: the holder's process, so a crashed holder on this machine can
            be proven dead and taken over before its lease runs out.
    """

    holder: str = ""
    term: int = 0
    expires_at: float = 0.0
    hostname: str = ""
    pid: int = 0
    birth: float = 0.0


class FileStateStore:
    """Atomic file store plus lease for one controller state path.

    Args:
        path: the state file (``…/state/controller.json``); its directory must exist or be
            creatable owner-only.
    """

    durable = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.lease_path = self.path.with_name(self.path.name + ".lease")
        self._lock = FileLock(
            str(self.path.with_name(self.path.name + ".lock")), timeout=LOCK_TIMEOUT_S
        )

    # --- state --------------------------------------------------------------------------
    def load(self) -> bytes | None:
        """The saved state bytes, or ``None`` when no file exists yet.

        Raises:
            StateError: the file exists but cannot be read.
        """
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            msg = f"cannot read controller state {self.path}: {exc.strerror}"
            raise StateError(msg) from None

    @staticmethod
    def _write_atomic(target: Path, data: bytes) -> None:
        """Durable atomic replace of ``target`` (owner-only); raises StateError."""
        try:
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"cannot create {target.parent}: {exc.strerror}; check its parent's permissions"
            raise StateError(msg) from None
        write_atomic(target, data)

    def save(self, data: bytes, expected: str | None) -> None:
        """Replace the state atomically, only if the file still holds what the writer saw.

        The compare and the rename happen under the same OS file lock as the lease, so two
        servers (or two controller instances) sharing this path cannot interleave them.

        Args:
            data: the new state document.
            expected: SHA-256 hex digest of the bytes this writer last loaded or wrote
                (``None`` when there was no state file).

        Raises:
            StateConflictError: the file changed since the writer saw it (another
                controller wrote it); the file is left untouched.
            StateError: the file could not be locked, read or written; the previous state
                is untouched.
        """
        try:
            with self._lock:
                check_expected(self.load(), expected, str(self.path))
                self._write_atomic(self.path, data)
        except Timeout:
            msg = f"cannot lock {self.path} for writing: another process holds it; retry shortly"
            raise StateError(msg) from None

    def quarantine(self, reason: str) -> str:
        """Move the corrupt state file aside (``controller.json.corrupt-<stamp>``).

        Args:
            reason: why (kept in a small note file beside the quarantined copy).

        Returns:
            The quarantined file's path.

        Raises:
            StateError: the file could not be moved.
        """
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        dest = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{secrets.token_hex(2)}")
        try:
            replace_durably(self.path, dest)
        except FileNotFoundError:
            return str(dest)
        except OSError as exc:
            msg = f"cannot quarantine {self.path}: {exc.strerror}; move or delete it by hand"
            raise StateError(msg) from None
        # The note is a courtesy; the quarantine itself already succeeded.
        with contextlib.suppress(StateError):
            self._write_atomic(dest.with_name(dest.name + ".reason"), reason.encode())
        return str(dest)

    # --- lease --------------------------------------------------------------------------
    def _read_lease(self) -> LeaseRecord:
        try:
            return msgspec.json.decode(self.lease_path.read_bytes(), type=LeaseRecord)
        except FileNotFoundError:
            return LeaseRecord()
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            # An unreadable lease grants nobody authority: guessing its term could hand out
            # a term that nodes already saw, so automatic mode waits for an operator.
            msg = (
                f"lease file {self.lease_path} is unreadable ({exc}); confirm no other Grid "
                "server uses this state directory, then delete it"
            )
            raise StateError(msg) from None

    def _holder_dead(self, rec: LeaseRecord) -> bool:
        """The recorded holder is provably gone (same machine, PID dead or reused)."""
        if rec.hostname != socket.gethostname() or rec.pid <= 0:
            return False
        return not same_birth(rec.pid, rec.birth)

    def acquire_lease(self, controller_id: str, now: float, ttl_s: float) -> tuple[int, float]:
        """Take or renew the single-writer lease.

        Args:
            controller_id: this controller's identity.
            now: wall-clock seconds.
            ttl_s: lease length in seconds.

        Returns:
            ``(term, expires_at)``; the term increases on every takeover, not on renewal.

        Raises:
            ConflictError: another live controller holds an unexpired lease.
            StateError: the lease file could not be locked or written.
        """
        try:
            with self._lock:
                rec = self._read_lease()
                if rec.holder != controller_id:
                    if rec.holder and rec.expires_at > now and not self._holder_dead(rec):
                        left = rec.expires_at - now
                        msg = (
                            f"controller '{rec.holder}' holds the single-writer lease for "
                            f"{left:.0f} s more (term {rec.term}); stop that server or wait"
                        )
                        raise ConflictError(msg)
                    rec = LeaseRecord(holder=controller_id, term=rec.term + 1)
                pid = os.getpid()
                rec.expires_at = now + ttl_s
                rec.hostname = socket.gethostname()
                rec.pid = pid
                rec.birth = birth_of(pid) or 0.0
                self._write_atomic(self.lease_path, msgspec.json.encode(rec))
                return rec.term, rec.expires_at
        except Timeout:
            msg = f"cannot lock {self.lease_path}: another process holds it; retry shortly"
            raise StateError(msg) from None

    def leader(self) -> LeaseHolder | None:
        """Who holds an unexpired lease now, or ``None`` (for followers' status).

        Raises:
            StateError: the lease file is unreadable.
        """
        rec = self._read_lease()
        left = rec.expires_at - time.time()
        if not rec.holder or left <= 0 or self._holder_dead(rec):
            return None
        return LeaseHolder(holder=rec.holder, term=rec.term, expires_in_s=left)

    def release_lease(self, controller_id: str) -> None:
        """Give the lease up at once on a clean stop (the term stays, so a successor adds one).

        Raises:
            StateError: the lease file could not be locked or written.
        """
        try:
            with self._lock:
                rec = self._read_lease()
                if rec.holder != controller_id:
                    return
                rec.expires_at = 0.0
                self._write_atomic(self.lease_path, msgspec.json.encode(rec))
        except Timeout:
            msg = f"cannot lock {self.lease_path}: another process holds it; retry shortly"
            raise StateError(msg) from None

    def seed_term(self, term: int) -> None:
        """Raise the lease's term to at least ``term`` (moving from another store), so the
        next takeover continues above every term nodes have seen.

        Raises:
            StateError: the lease file could not be locked or written.
        """
        try:
            with self._lock:
                rec = self._read_lease()
                if rec.term >= term:
                    return
                rec.term = term
                self._write_atomic(self.lease_path, msgspec.json.encode(rec))
        except Timeout:
            msg = f"cannot lock {self.lease_path}: another process holds it; retry shortly"
            raise StateError(msg) from None
