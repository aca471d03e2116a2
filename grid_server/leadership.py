"""Leader election between several Grid servers on one replicated state store (etcd).

Every server runs the router, registers nodes and serves read-only status. Exactly one of them
(the leader) holds the store's controller lease: its controller plans, writes the durable
document and commands nodes. The others follow: they keep a read-only controller restored from
the newest document (for status and ``Retry-After`` estimates), refuse operator changes with a
pointer to the leader, send no commands and ignore receipts. When the leader's lease lapses (it
was killed, or cut from etcd), a follower is elected, restores the newest document into a fresh
controller and carries on with the next term.

Specification, "Local wire contract" (a renewable single-writer lease, a new term on every
takeover, commands stamped with term and controller id so nodes refuse a stale leader).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import anyio

from grid_core.errors import ConflictError, GridError
from grid_core.store import LeaseHolder, state_digest
from grid_server.runner import ControllerRunner

log = logging.getLogger("grid.server.leadership")

ELECTION_POLLS_PER_LEASE = 6
"""Keep-alives per lease length: a leader renews six times before its lease could lapse, so
one or two lost renewals (a loaded machine, an etcd leader change) cost nothing."""
FOLLOWER_POLL_S = 0.25
"""Longest wait between a follower's election attempts: it takes over at most this long after
etcd expired the leader's lease (etcd itself checks expiries every 500 ms)."""
FOLLOWER_VIEW_REFRESH_S = 5.0
"""Oldest a follower's read-only view of the document gets (status, Retry-After estimates):
reading and decoding the whole document on every election attempt would be wasted work."""
UNREACHABLE = "this Grid server lost contact with etcd and stopped acting as leader"
"""Refusal while a leader cannot renew its lease: it plans, writes and commands nothing until
etcd answers again (its lease may lapse meanwhile, and a follower may take over)."""


class Leadership:
    """Elects this server or follows another, and swaps the runner's controller accordingly.

    Args:
        store: the replicated store (it has ``acquire_lease``, ``leader``, ``release_lease``
            and ``load``).
        runner: the server's controller runner.
        build: makes a restored controller on ``store`` with the given controller id.
        lease_s: the controller lease length in seconds.
        clock: wall-clock seconds.

    Attributes:
        server_id: this server's controller identity (stamped on its commands when it leads).
        role: ``leader``, ``follower`` or ``starting``.
        leader: the current holder as last read from the store (``None`` when nobody holds
            it or the store was unreachable).
        error: the last store error, if the last attempt failed.
        took_over_at: wall-clock seconds this server last became leader.
    """

    def __init__(
        self,
        store: Any,
        runner: ControllerRunner,
        build: Callable[[str], Any],
        *,
        lease_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.runner = runner
        self.build = build
        self.lease_s = lease_s
        self.clock = clock
        self.server_id = secrets.token_hex(8)
        self.role = "starting"
        self.leader: LeaseHolder | None = None
        self.error: str | None = None
        self.took_over_at: float | None = None
        self._digest: str | None = None
        self._viewed_at = float("-inf")
        runner.follower = "this Grid server is starting and has not been elected yet"

    def refusal(self) -> str:
        """Why this server refuses an operator change, naming the leader when known."""
        holder = self.leader
        if holder is None:
            return (
                "this Grid server is a follower and no leader holds the controller lease right "
                f"now; retry in a few seconds ({self.error or 'election in progress'})"
            )
        where = f" at {holder.url}" if holder.url else ""
        return (
            f"this Grid server is a follower; the leader is controller {holder.holder} "
            f"(term {holder.term}){where}: send operator changes there"
        )

    async def step(self) -> None:
        """One election attempt: renew or take the lease, or follow the holder."""
        now = self.clock()
        try:
            await anyio.to_thread.run_sync(
                lambda: self.store.acquire_lease(self.server_id, now, self.lease_s)
            )
        except ConflictError as exc:
            self.error = None
            await self._follow(str(exc))
            return
        except GridError as exc:
            # etcd unreachable: stop acting at once (no pass, no command, no operator change);
            # the lease lapses unless a later renewal reaches etcd in time.
            self.error = str(exc)
            if self.role == "leader":
                self.runner.follower = f"{UNREACHABLE}: {exc}"
            return
        self.error = None
        if self.role != "leader":
            await self._lead(now)
        elif self.runner.follower is not None:
            # The same lease was renewed: nobody else could have written meanwhile.
            self.runner.follower = None
            log.warning("etcd answers again; still the leader (term %s)", self.store.term)

    async def _lead(self, now: float) -> None:
        ctl = await anyio.to_thread.run_sync(lambda: self.build(self.server_id))
        await self.runner.swap(ctl, follower=None)
        self.role, self.took_over_at = "leader", now
        self.leader = LeaseHolder(
            holder=self.server_id,
            term=int(getattr(self.store, "term", 0) or 0),
            url=str(getattr(self.store, "advertise_url", "") or ""),
            expires_in_s=self.lease_s,
        )
        log.warning("elected leader of the controller (term %s)", self.leader.term)

    async def _follow(self, why: str) -> None:
        was_leader = self.role == "leader"
        self.role = "follower"
        mono = time.monotonic()
        fresh = was_leader or mono - self._viewed_at >= FOLLOWER_VIEW_REFRESH_S
        try:
            self.leader = await anyio.to_thread.run_sync(self.store.leader)
            raw = await anyio.to_thread.run_sync(self.store.load) if fresh else None
        except GridError as exc:
            self.error = str(exc)
            self.runner.follower = self.refusal()
            return
        self.runner.follower = self.refusal()
        if not fresh:
            return
        self._viewed_at = mono
        digest = state_digest(raw)
        if was_leader or digest != self._digest:
            # A read-only view of the newest document, for status and estimates.
            ctl = await anyio.to_thread.run_sync(lambda: self.build(secrets.token_hex(8)))
            await self.runner.swap(ctl, follower=self.refusal())
            self._digest = digest
        if was_leader:
            log.warning("lost the controller lease: %s", why)

    async def run(self) -> None:
        """Renew every ``lease_s / ELECTION_POLLS_PER_LEASE`` s while leading, try every
        :data:`FOLLOWER_POLL_S` (at most) while following; until cancelled."""
        renew = self.lease_s / ELECTION_POLLS_PER_LEASE
        while True:
            try:
                await self.step()
            except Exception:  # a failed attempt is retried; status shows the error
                log.exception("leader election attempt failed")
            await anyio.sleep(renew if self.role == "leader" else min(renew, FOLLOWER_POLL_S))

    def release(self) -> None:
        """Give the lease up on a clean stop so a follower takes over at once."""
        if self.role == "leader":
            try:
                self.store.release_lease(self.server_id)
            except GridError as exc:
                log.warning("could not release the controller lease: %s", exc)

    def status(self) -> dict[str, Any]:
        """This server's place in the election, for ``/allocator/status``."""
        holder = self.leader
        return {
            "role": self.role,
            "server_id": self.server_id,
            "store": repr(self.store),
            "leader": None
            if holder is None
            else {
                "controller_id": holder.holder,
                "term": holder.term,
                "url": holder.url,
                "expires_in_s": round(holder.expires_in_s, 1),
            },
            "took_over_at": self.took_over_at,
            "error": self.error,
            "forwarding": forwarder.status() if (forwarder := self.runner.forwarder) else None,
        }
