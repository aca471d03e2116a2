"""Fleet-wide holds: the restart grace and the membership hiccup.

After a restart from durable state, destructive work waits one grace period so nodes can
report what actually happened while the controller was away. When a large share of fresh
hosts disappears at once (a network partition or a server-side stall more likely than many
hosts failing together), every mutation waits until enough of them are back or the grace
period passes. Specification: the restart rules of "HTTP control surface" and "Safety
invariants" (a stale view never drives destructive work).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from grid_core.reconcile.policy import GovernorPolicy
from grid_core.reconcile.view import fresh
from grid_core.snapshot import HostSnapshot


class TickHolds(msgspec.Struct, frozen=True, kw_only=True):
    """The holds in force for one tick.

    Attributes:
        destructive: hold on destructive work (``restart_grace`` or ``membership_hiccup``).
        mutation: hold on every mutation (``membership_hiccup``).
        grace_ended: the restart grace ended at this tick (restored undelivered commands for
            absent hosts should end now).
    """

    destructive: str | None = None
    mutation: str | None = None
    grace_ended: bool = False


class Holds:
    """Tracks the restart grace and membership hiccups across ticks.

    Args:
        policy: governor tunables (``restart_grace_s``, ``hiccup_fraction``, freshness).
    """

    def __init__(self, policy: GovernorPolicy) -> None:
        self._policy = policy
        self._restored = False
        self._grace_anchor: float | None = None  # first tick after the restore
        self._fresh_hosts: frozenset[str] = frozenset()
        self._hiccup: tuple[float, frozenset[str]] | None = None

    def restored(self) -> None:
        """The controller continued from durable state: the restart grace applies."""
        self._restored = True

    def grace_until(self) -> float | None:
        """When the restart grace ends (wall-clock seconds), while one is pending."""
        if self._restored and self._grace_anchor is not None:
            return self._grace_anchor + self._policy.restart_grace_s
        return None

    def destructive_delivery_held(self, now: float) -> bool:
        """Whether destructive commands must not be delivered at ``now``."""
        until = self.grace_until()
        return (until is not None and now < until) or self._hiccup is not None

    def for_tick(self, now: float, hosts: Mapping[str, HostSnapshot]) -> TickHolds:
        """Advance the holds with this tick's host snapshots and return those in force.

        Args:
            now: wall-clock seconds.
            hosts: host id → snapshot of this tick.
        """
        gp = self._policy
        destructive = None
        grace_ended = False
        if self._restored:
            if self._grace_anchor is None or now < self._grace_anchor:
                self._grace_anchor = now  # first tick, or the wall clock moved backward
            if now < self._grace_anchor + gp.restart_grace_s:
                destructive = "restart_grace"
            else:
                self._restored = False
                grace_ended = True
        fresh_now = frozenset(h for h, s in hosts.items() if fresh(s, gp))
        mutation = None
        if self._hiccup is not None:
            since, lost = self._hiccup
            back = len(lost & fresh_now)
            if now - since < gp.restart_grace_s and back < len(lost) * (1 - gp.hiccup_fraction):
                mutation = "membership_hiccup"
            else:
                self._hiccup = None
        else:
            lost = self._fresh_hosts - fresh_now
            if self._fresh_hosts and len(lost) > len(self._fresh_hosts) * gp.hiccup_fraction:
                self._hiccup = (now, lost)
                mutation = "membership_hiccup"
        if mutation is None:
            self._fresh_hosts = fresh_now
        return TickHolds(
            destructive=destructive or mutation, mutation=mutation, grace_ended=grace_ended
        )
