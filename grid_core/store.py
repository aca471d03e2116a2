"""The controller's durable-state interface (the file implementation lives in grid_server)."""

from __future__ import annotations

from typing import Protocol


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

    def save(self, data: bytes) -> None:
        """Replace the saved state atomically.

        Raises:
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

    def save(self, data: bytes) -> None:
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
