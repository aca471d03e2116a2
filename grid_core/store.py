"""The controller's durable-state interface (the file implementation lives in grid_server).

Writes are conditional (optimistic concurrency): every ``save`` names the digest of the
state the writer last loaded or wrote, and the store refuses the write when the stored bytes
differ. A superseded controller instance (one that kept running after a restart created its
successor on the same store) therefore can never overwrite newer durable state.
Specification: "Local wire contract" (a single writer) and "HTTP control surface".
"""

from __future__ import annotations

import hashlib
from typing import Literal, Protocol

import msgspec

from grid_core.errors import ConflictError, StateError


class StateConflictError(ConflictError, StateError):
    """The stored state is not the one the writer last saw: another controller wrote it.

    Raised by :meth:`StateStore.save`; nothing was written. The writer's view is stale, so
    it must stop acting; restarting the Grid server restores the newer state.
    """


def state_digest(data: bytes | None) -> str | None:
    """SHA-256 hex digest of saved state bytes (``None`` for "no state yet").

    This is the ``expected`` value a writer passes to :meth:`StateStore.save`.
    """
    return None if data is None else hashlib.sha256(data).hexdigest()


def check_expected(current: bytes | None, expected: str | None, where: str) -> None:
    """Refuse a conditional write whose ``expected`` digest does not match ``current``.

    Args:
        current: the bytes stored right now (``None`` when there is no state).
        expected: the digest of the bytes the writer last loaded or wrote.
        where: the state's location, for the message.

    Raises:
        StateConflictError: the stored state changed since the writer saw it.
    """
    actual = state_digest(current)
    if actual != expected:
        seen = "no state" if expected is None else f"state {expected[:12]}"
        now = "no state" if actual is None else f"state {actual[:12]}"
        msg = (
            f"controller state {where} was written by another controller (expected {seen}, "
            f"found {now}); this controller is superseded and wrote nothing — restart the "
            "Grid server so a single controller restores the newest state"
        )
        raise StateConflictError(msg)


class LeaseHolder(msgspec.Struct, frozen=True, kw_only=True):
    """Who holds the single-writer lease, as a follower reports it.

    Attributes:
        holder: the controller id holding mutation authority.
        term: its term.
        url: the Grid server URL it advertised (empty when unknown).
        expires_in_s: seconds until the lease lapses unless renewed (store's clock).
    """

    holder: str
    term: int
    url: str = ""
    expires_in_s: float = 0.0


class StateStore(Protocol):
    """Where the controller keeps its durable state and its single-writer lease.

    Implementations write atomically (temp file, fsync, rename) so a crash leaves either the
    old or the new state, never a mix.
    """

    @property
    def durable(self) -> bool:
        """True when writes survive a restart; automatic mode is refused otherwise."""
        ...

    def load(self) -> bytes | None:
        """The last saved state, or ``None`` when there is none yet.

        Raises:
            StateError: the state exists but cannot be read.
        """
        ...

    def save(self, data: bytes, expected: str | None) -> None:
        """Replace the saved state atomically, only if it is still what the writer saw.

        Args:
            data: the new state document.
            expected: :func:`state_digest` of the bytes this writer last loaded or wrote
                (``None`` when there was no state). Compared with the stored bytes under
                the store's lock.

        Raises:
            StateConflictError: the stored state differs from ``expected`` (another
                controller wrote it); nothing is written.
            StateError: the write failed; the previous state is untouched.
        """
        ...

    def quarantine(self, reason: str) -> str:
        """Move a corrupt state file aside; returns where it went.

        Raises:
            StateError: it could not be moved (automatic mode must then be refused).
        """
        ...

    def acquire_lease(self, controller_id: str, now: float, ttl_s: float) -> tuple[int, float]:
        """Take or renew the single-writer lease beside the state file.

        Args:
            controller_id: this controller's identity.
            now: wall-clock seconds.
            ttl_s: lease length in seconds.

        Returns:
            ``(term, expires_at)``; the term increases on every takeover, never on renewal.

        Raises:
            ConflictError: another live controller holds the lease.
        """
        ...


class MemoryStore:
    """A non-durable store for tests and the scenario lab (automatic mode is refused)."""

    durable = False

    def __init__(self) -> None:
        self.data: bytes | None = None
        self._holder: str | None = None
        self._term = 0
        self._expires = 0.0

    def load(self) -> bytes | None:
        return self.data

    def save(self, data: bytes, expected: str | None) -> None:
        check_expected(self.data, expected, "in memory")
        self.data = data

    def quarantine(self, reason: str) -> str:
        self.data = None
        return "memory"

    def acquire_lease(self, controller_id: str, now: float, ttl_s: float) -> tuple[int, float]:
        if self._holder != controller_id:
            self._term += 1
            self._holder = controller_id
        self._expires = now + ttl_s
        return self._term, self._expires


class StoreIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """Which durable store holds a controller's state: what a running server records in
    ``server.json`` and ``grid allocator state copy`` compares its two stores with.

    Attributes:
        kind: ``file`` (the file store) or ``etcd``.
        path: file store: the state file's absolute path, symlinks resolved.
        endpoints: etcd: the client URLs the store was given (``http(s)://host:port``).
        prefix: etcd: the key prefix (starts and ends with ``/``).
    """

    kind: Literal["file", "etcd"]
    path: str = ""
    endpoints: tuple[str, ...] = ()
    prefix: str = ""

    def describe(self) -> str:
        """The store as an operator reads it (no secrets)."""
        if self.kind == "file":
            return f"the file store {self.path}"
        return f"etcd {','.join(self.endpoints)} prefix {self.prefix}"


def may_share_state(a: StoreIdentity, b: StoreIdentity) -> bool:
    """Whether two stores may hold the same controller state (so a server using one is
    disturbed by a copy to or from the other).

    Two file stores are the same when their state files are the same path. Two etcd stores are
    taken to be the same whenever their key prefixes are equal, whatever their endpoints: one
    cluster answers under several names and addresses, so different endpoints do not prove
    different clusters, while different prefixes never share a key. A file store and an etcd
    store never share state.
    """
    if a.kind != b.kind:
        return False
    if a.kind == "file":
        return a.path == b.path
    return a.prefix == b.prefix
