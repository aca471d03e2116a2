"""Mutation authority: the operating mode, the single-writer lease and its term.

Only a controller in automatic mode that holds the lease beside the durable state may issue
commands; every command carries the term and lease expiry so a node can refuse one from a
controller that lost authority. A controller whose conditional state write found a newer
writer is superseded for good. Specification: "Reconciliation and modes" and "Local wire
contract" (controller term and lease, a single writer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from grid_core.errors import ConflictError, GridError, StateError, ValidationError
from grid_core.wire import Mode

MODES: tuple[Mode, ...] = ("observe", "recommend", "automatic")
CONTROLLER_LEASE_S = 30.0
"""Single-writer lease length: six default 5 s ticks, so a live controller always renews in
time, while a dead one's authority lapses within half a minute."""
LEASE_RENEW_FRACTION = 0.5
"""Renew once less than this share of the lease is left (avoids a write on every call)."""
SUPERSEDED = "lost: state was written by another controller"
"""Authority shown in status once a conditional save found newer state from another writer."""


class LeaseStore(Protocol):
    """Where the single-writer lease lives (the durable state store provides it)."""

    def acquire_lease(self, controller_id: str, now: float, ttl_s: float) -> tuple[int, float]:
        """Take or renew the lease; returns ``(term, expires_at)`` (wall-clock seconds).

        Raises:
            ConflictError: another live controller holds the lease.
            StateError: the lease file could not be read or written.
        """
        ...


def check_mode(mode: str) -> Mode:
    """``mode`` as a :data:`~grid_core.wire.Mode`.

    Raises:
        ValidationError: not one of observe, recommend, automatic.
    """
    for known in MODES:
        if mode == known:
            return known
    msg = f"mode '{mode}' is unknown; use one of {', '.join(MODES)}"
    raise ValidationError(msg)


class Authority:
    """The controller's mode, lease and term, and whether it may mutate the fleet.

    Args:
        lease: the store holding the single-writer lease.
        controller_id: identity stamped on commands and on the lease.
        warn: where notable changes go (the controller's status warnings).
        lease_s: lease length in seconds (``ControllerPolicy.controller_lease_s``).

    Attributes:
        controller_id: as given.
        mode: current mode (a plain attribute, readable without the server lock).
        term: lease term of the last acquisition (0 before the first).
        lease_expires_at: wall-clock seconds the held lease ends (0 when none).
        state: ``held``, ``none`` (not automatic), ``pending`` (automatic restored, the
            lease is taken on the first tick or poll) or ``lost: <cause>``.
        refusal: why automatic mode is refused (no durable or readable state), if it is.
        superseded: another controller wrote the durable state; this one never acts again.
    """

    def __init__(
        self,
        lease: LeaseStore,
        controller_id: str,
        warn: Callable[[str], None],
        lease_s: float = CONTROLLER_LEASE_S,
    ):
        self._lease = lease
        self.lease_s = lease_s
        self._warn = warn
        self.controller_id = controller_id
        self.mode: Mode = "recommend"
        self.term = 0
        self.lease_expires_at = 0.0
        self.state = "none"
        self.refusal: str | None = None
        self.superseded = False

    def refuse_automatic(self, cause: str) -> None:
        """Refuse automatic mode from now on, saying why (status shows ``cause``)."""
        self.refusal = cause

    def settled(self, mode: Mode) -> bool:
        """Whether selecting ``mode`` would change nothing."""
        return mode == self.mode and (mode != "automatic" or self.state == "held")

    def enter_automatic(self, now: float) -> None:
        """Take the lease and switch to automatic.

        Raises:
            ConflictError: automatic is refused (see :attr:`refusal`), another controller
                holds the lease, or the lease file failed; nothing changed.
        """
        if self.refusal is not None:
            msg = f"automatic mode refused: {self.refusal}"
            raise ConflictError(msg)
        try:
            self.term, self.lease_expires_at = self._lease.acquire_lease(
                self.controller_id, now, self.lease_s
            )
        except StateError as exc:
            msg = f"automatic mode refused: the lease beside the state file failed: {exc}"
            raise ConflictError(msg) from None
        self.mode = "automatic"
        self.state = "held"

    def leave(self, mode: Mode) -> None:
        """Switch to ``mode`` without mutation authority (also undoes a failed entry)."""
        self.mode = mode
        self.state = "none"

    def resume(self, mode: Mode) -> bool:
        """Adopt a restored ``mode``; returns False when automatic could not resume.

        A restored automatic mode takes its lease (term + 1) on the first tick or poll, never
        here (no clock is read). When automatic is refused the mode falls back to recommend.
        """
        self.mode = mode
        if mode != "automatic":
            return True
        if self.refusal is not None:
            self.mode = "recommend"
            self._warn(f"automatic mode not resumed after restart: {self.refusal}")
            return False
        self.state = "pending"
        return True

    def renew(self, now: float) -> bool:
        """Keep the lease; returns whether this controller may mutate the fleet now."""
        if self.mode != "automatic" or self.superseded:
            return False
        # A wall clock that moved backward must not stretch the old deadline: renew then too.
        if self.state == "held" and self.lease_expires_at - self.lease_s <= now < (
            self.lease_expires_at - self.lease_s * LEASE_RENEW_FRACTION
        ):
            return True
        try:
            term, expires = self._lease.acquire_lease(self.controller_id, now, self.lease_s)
        except GridError as exc:
            self.state = f"lost: {exc}"
            return False
        if term != self.term and self.term:
            self._warn(f"controller term moved from {self.term} to {term}")
        self.term, self.lease_expires_at, self.state = term, expires, "held"
        return True

    def confirm(self, now: float) -> bool:
        """Renew through the store even inside the lease's fresh half; returns whether the
        lease is still this controller's.

        :meth:`renew` trusts a recently renewed lease without asking the store, which is
        right for availability work. A drain or unload is different: an instance that lost
        the lease without noticing (its store released it, or a successor took it over) must
        not hand one out under its old term, so the delivery of a destructive command asks
        the store first (specification, "Local wire contract": a renewable single-writer
        lease fences mutation authority).
        """
        if self.mode != "automatic" or self.superseded or self.state != "held":
            return False
        try:
            term, expires = self._lease.acquire_lease(self.controller_id, now, self.lease_s)
        except GridError as exc:
            self.state = f"lost: {exc}"
            self.lease_expires_at = 0.0
            return False
        if term != self.term:
            # The store gave this controller a new term: whatever it decided under the old
            # one was decided without authority in between, so nothing is handed out now.
            self._warn(f"controller term moved from {self.term} to {term}")
            self.term, self.lease_expires_at = term, expires
            return False
        self.lease_expires_at = expires
        return True

    def ttl(self, now: float) -> float:
        """Seconds of authority left in the server's clock (never more than one lease)."""
        return min(self.lease_s, max(0.0, self.lease_expires_at - now))

    def supersede(self) -> None:
        """Stop for good: another controller wrote the durable state after this one."""
        self.superseded = True
        self.state = SUPERSEDED
        self.lease_expires_at = 0.0  # stamps no further command and renews nothing
