"""The router's mutable state: in-flight counts, circuit breakers and measurements.

Policy lives in :mod:`grid_core.routing`; this module only keeps the state the policy reads
and turns registry records into route candidates. Nothing here is persisted: breakers and
measurements start empty after a restart (source: "Global placement loop").
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import anyio

from grid_core import routing
from grid_core.hosts import RegistryRecord
from grid_core.routing import Breaker, Measurement, RouteCandidate
from grid_core.wire import HostState, Residency
from grid_server.registry import Registry

MAX_TRACKED = 16384
"""Ceiling on breaker and measurement entries (engines × models); stale ones are pruned."""
BUSY_RETRY_AFTER_MAX_S = 30.0
"""Longest Retry-After for a saturated model: by then a slot has turned over many times."""
DEFAULT_SERVICE_S = 1.0
"""Service time assumed for a saturated model without measurements (one short answer)."""


class Route:
    """A routable engine for one model, resolved from the registry (cached per revision)."""

    __slots__ = ("artifact", "control", "engine", "model_id", "residency")

    def __init__(
        self,
        engine: RegistryRecord,
        model_id: str,
        control: RegistryRecord | None,
        residency: Residency | None,
    ) -> None:
        self.engine = engine
        self.model_id = model_id
        self.control = control
        self.residency = residency
        self.artifact = residency.artifact_sha256 if residency else None


class RouterState:
    """Per-engine in-flight counts, per-(engine, model) breakers, per-(host, model) EWMAs."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.inflight: dict[str, int] = {}
        self.breakers: dict[tuple[str, str], Breaker] = {}
        self.measurements: dict[tuple[str, str], Measurement] = {}
        self.last_used: dict[tuple[str, str], float] = {}
        self._routes: dict[str, list[Route]] = {}
        self._routes_revision = -1
        self._waiting: dict[str, int] = {}
        self._slot_freed: anyio.Event | None = None

    # --- route table -------------------------------------------------------------------
    def routes(self, model_id: str) -> list[Route]:
        """Engines that list ``model_id`` (not yet filtered for health or lease)."""
        if self._routes_revision != self.registry.revision:
            self._rebuild()
        return self._routes.get(model_id, [])

    def routed_models(self) -> Iterable[str]:
        """Every model some engine record lists."""
        if self._routes_revision != self.registry.revision:
            self._rebuild()
        return self._routes.keys()

    def _rebuild(self) -> None:
        table: dict[str, list[Route]] = {}
        records = self.registry.records
        for rec in records.values():
            if rec.role != "engine" or not rec.url:
                continue
            control = self.registry.control_of(rec.host_id)
            env = control.allocator if control else None
            for model in rec.models:
                residency = None
                if env is not None:
                    residency = next((r for r in env.residencies if r.model_id == model), None)
                table.setdefault(model, []).append(Route(rec, model, control, residency))
        self._routes = table
        self._routes_revision = self.registry.revision

    def candidates(
        self, routes: list[Route], now: float, mono: float, *, breakers: bool = True
    ) -> list[RouteCandidate]:
        """Route candidates for the policy, with live in-flight, breaker and measurement.

        ``breakers=False`` ignores circuit state (discovery: an open breaker steers requests
        but never changes the advertised inventory).
        """
        out: list[RouteCandidate] = []
        for r in routes:
            eng, ctl = r.engine, r.control
            env = ctl.allocator if ctl is not None else None
            host_state: HostState = "accepting"
            if ctl is not None:
                # A control record without an envelope, or with rejected rows, fails closed.
                host_state = env.state if env is not None and not ctl.rejected_rows else "unhealthy"
                admitted = eng.live(now) and ctl.live(now)
            else:
                admitted = eng.live(now)
            res = r.residency
            m = self.measurements.get((eng.host_id, r.model_id))
            if m is not None and r.artifact is not None and m.artifact_sha256 != r.artifact:
                m = None  # evidence from the previous revision is ignored after a rollout
            b = self.breakers.get((eng.record_id, r.model_id))
            out.append(
                RouteCandidate(
                    engine_id=eng.record_id,
                    host_id=eng.host_id,
                    host_state=host_state,
                    residency_state=res.state if res else None,
                    admitted=admitted,
                    active_requests=self.inflight.get(eng.record_id, 0),
                    max_concurrency=res.max_concurrency if res else None,
                    queue_depth=res.queue_depth if res else 0,
                    lease_age_s=now - eng.received_at,
                    measurement=m,
                    breaker_open=breakers and b is not None and b.is_open(mono),
                    concurrency_multiplier=(
                        ctl.resources.throttle_fraction
                        if ctl is not None and ctl.resources is not None
                        else 1.0
                    ),
                )
            )
        return out

    # --- request lifecycle ----------------------------------------------------------------
    def begin(self, route: Route, mono: float) -> None:
        """A request is about to go to ``route``."""
        eid = route.engine.record_id
        self.inflight[eid] = self.inflight.get(eid, 0) + 1
        key = (eid, route.model_id)
        b = self.breakers.get(key)
        if b is not None:
            self.breakers[key] = routing.begin_request(b, mono)

    def finish(
        self,
        route: Route,
        outcome: routing.BreakerOutcome,
        mono: float,
        now: float,
        latency_ms: float | None = None,
        completion_tokens: int | None = None,
        service_s: float | None = None,
    ) -> None:
        """Record the outcome of a request that went to ``route``."""
        eid = route.engine.record_id
        n = self.inflight.get(eid, 1) - 1
        if n > 0:
            self.inflight[eid] = n
        else:
            self.inflight.pop(eid, None)
        if self._slot_freed is not None:
            freed, self._slot_freed = self._slot_freed, None
            freed.set()
        key = (eid, route.model_id)
        b = self.breakers.get(key, routing.CLOSED)
        nb = routing.record_outcome(b, outcome, mono)
        if nb == routing.CLOSED:
            self.breakers.pop(key, None)
        elif len(self.breakers) < MAX_TRACKED or key in self.breakers:
            self.breakers[key] = nb
        if outcome == "success" and latency_ms is not None:
            mkey = (route.engine.host_id, route.model_id)
            if len(self.measurements) < MAX_TRACKED or mkey in self.measurements:
                self.measurements[mkey] = routing.record_sample(
                    self.measurements.get(mkey),
                    now,
                    latency_ms,
                    completion_tokens,
                    service_s,
                    route.artifact,
                )
            if len(self.last_used) >= MAX_TRACKED and mkey not in self.last_used:
                # Forget the least recently used half; hosts that left stop being tracked.
                keep = sorted(self.last_used.items(), key=lambda kv: kv[1])[MAX_TRACKED // 2 :]
                self.last_used = dict(keep)
            self.last_used[mkey] = now

    # --- admission wait -----------------------------------------------------------------
    def waiting(self, model_id: str) -> int:
        """Requests of ``model_id`` waiting for a slot now."""
        return self._waiting.get(model_id, 0)

    async def wait_for_slot(self, model_id: str, timeout_s: float) -> None:
        """Wait until any in-flight request finishes, or ``timeout_s`` passes."""
        self._waiting[model_id] = self._waiting.get(model_id, 0) + 1
        if self._slot_freed is None:
            self._slot_freed = anyio.Event()
        freed = self._slot_freed
        try:
            with anyio.move_on_after(timeout_s):
                await freed.wait()
        finally:
            left = self._waiting[model_id] - 1
            if left > 0:
                self._waiting[model_id] = left
            else:
                del self._waiting[model_id]

    def busy_retry_after_s(self, model_id: str, now: float) -> int:
        """Retry-After for a model whose every ready engine is saturated (whole seconds).

        One measured service time (end-to-end latency EWMA of this model, else
        :data:`DEFAULT_SERVICE_S`) times the waves of waiting work per slot, at least one
        second and at most :data:`BUSY_RETRY_AFTER_MAX_S`.
        """
        routes = self.routes(model_id)
        latencies = [
            m.latency_ms / 1000.0
            for r in routes
            if (m := self.measurements.get((r.engine.host_id, model_id))) is not None
            and m.latency_ms is not None
            and routing.latency_confidence(m, now) > 0
        ]
        service_s = min(latencies) if latencies else DEFAULT_SERVICE_S
        slots = sum(
            (r.residency.max_concurrency or 1) if r.residency is not None else 1 for r in routes
        )
        waves = 1.0 + self.waiting(model_id) / max(1, slots)
        return int(min(BUSY_RETRY_AFTER_MAX_S, max(1.0, math.ceil(service_s * waves))))

    def public_breakers(self, mono: float) -> list[dict[str, object]]:
        """Open breakers for status (engine ids and timings only)."""
        return [
            {
                "engine_id": eid,
                "model_id": model,
                "streak": b.streak,
                "open_for_s": round(max(0.0, b.open_until - mono), 3),
            }
            for (eid, model), b in sorted(self.breakers.items())
            if b.is_open(mono)
        ]

    def model_last_used(self, host_id: str) -> dict[str, float]:
        """Server-observed last use per model on ``host_id`` (heartbeat responses)."""
        return {m: t for (h, m), t in self.last_used.items() if h == host_id}
