"""A follower's answered requests reach the leader's demand history.

With several servers on etcd, clients (or a load balancer) may send requests to any of them,
but only the leader's controller forecasts and plans. A request a follower routed would
otherwise never count as demand: a model used only through followers would look idle and be
scaled down. The follower keeps each request's bounded features (never prompts or raw
affinity keys) in a bounded queue and sends them to the leader's ``POST
/allocator/observations`` every :data:`FORWARD_INTERVAL_S` with the operator token every server
of one grid shares; if this server becomes the leader, it feeds the queue to its own
controller. Source: the specification's demand forecast (every observed request is demand)
applied to the replicated control plane (docs/operations.md).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from grid_core.bodies import MAX_FORWARDED_OBSERVATIONS, ObservationBatch
from grid_core.client import AsyncGridClient, Calls
from grid_core.demand.features import RequestFeatures
from grid_core.errors import GridError

log = logging.getLogger("grid.server.forwarding")

FORWARD_INTERVAL_S = 2.0
"""Seconds between forwarding calls: the leader's passes run every few seconds, so demand
seen by a follower counts within about one pass."""
MAX_FORWARD_PENDING = 8192
"""Observations a follower keeps while the leader cannot be reached (about half a minute at
256 requests/s); beyond it the oldest are dropped and counted in status."""
FORWARD_TIMEOUT_S = 10.0
"""Deadline of one forwarding call (a leader answers it in milliseconds)."""


class DemandForwarder:
    """Queue of request features seen while this server follows, and the loop that sends them.

    Args:
        leadership: the server's :class:`grid_server.leadership.Leadership`.
        observe: queues one observation for this server's own controller (never forwards).
        operator_token: reads the operator capability every server of the grid shares.
        ca_file: CA the leader's ``https://`` URL is verified with (``None``: system store).

    Attributes:
        forwarded: observations the leader accepted. dropped: observations lost to the bound.
        error: the last forwarding failure (``None`` after a success).
    """

    def __init__(
        self,
        leadership: Any,
        observe: Callable[[RequestFeatures], None],
        operator_token: Callable[[], str],
        ca_file: Path | None = None,
    ) -> None:
        self.leadership = leadership
        self.observe = observe
        self.operator_token = operator_token
        self.ca_file = ca_file
        self.pending: deque[RequestFeatures] = deque()
        self.forwarded = 0
        self.dropped = 0
        self.error: str | None = None

    def add(self, features: RequestFeatures) -> None:
        """Keep one observation for the leader (drops the oldest beyond the bound)."""
        if len(self.pending) >= MAX_FORWARD_PENDING:
            self.pending.popleft()
            self.dropped += 1
        self.pending.append(features)

    async def flush(self) -> None:
        """Send what is queued to the leader, or feed it locally if this server now leads."""
        if not self.pending:
            return
        if self.leadership.role == "leader":
            if self.leadership.runner.follower is None:  # leading and acting: count them here
                while self.pending:
                    self.observe(self.pending.popleft())
            return
        holder = self.leadership.leader
        if holder is None or not holder.url or holder.holder == self.leadership.server_id:
            return
        size = min(len(self.pending), MAX_FORWARDED_OBSERVATIONS)
        batch = [self.pending.popleft() for _ in range(size)]
        body = ObservationBatch(from_server=self.leadership.server_id, features=batch)
        try:
            client = AsyncGridClient(
                holder.url,
                operator_token=self.operator_token(),
                timeout=FORWARD_TIMEOUT_S,
                ca_file=self.ca_file,
            )
            try:
                await client.send(Calls.forward_observations(body))
            finally:
                await client.aclose()
        except (GridError, OSError) as exc:
            self.pending.extendleft(reversed(batch))  # keep order; the bound applies on add
            self.error = f"{holder.url}: {exc}"[:300]
            return
        self.forwarded += len(batch)
        self.error = None

    async def run(self) -> None:
        """Flush every :data:`FORWARD_INTERVAL_S` until cancelled."""
        while True:
            await anyio.sleep(FORWARD_INTERVAL_S)
            try:
                await self.flush()
            except Exception:  # a failed flush is retried; status shows the error
                log.exception("forwarding observations to the leader failed")

    def status(self) -> dict[str, Any]:
        """Counters for ``server.state_store.forwarding`` in status."""
        return {
            "pending": len(self.pending),
            "forwarded": self.forwarded,
            "dropped": self.dropped,
            "error": self.error,
        }
