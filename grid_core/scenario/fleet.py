"""The simulated nodes: residencies, disk, events, and what the controller sees of them.

The lab plays every node. It turns orders (load, warm, drain, unload, evict) into residency
transitions with the same fences a real node applies: a load becomes READY one tick later,
a removal waits for the model's minimum residency, memory and model slots are never
overcommitted, disk consumed by a download stays consumed. Orders the node would refuse are
refused and counted by the safety audit. Each tick the fleet reports
:class:`~grid_core.snapshot.HostSnapshot` values built from this state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grid_core.demand.prefetch import PREDICTIVE_FETCH
from grid_core.profile import ModelProfile
from grid_core.scenario.arrivals import FleetEvents
from grid_core.scenario.catalog import CatalogEntry
from grid_core.scenario.config import TICK_S
from grid_core.scenario.topology import Machine
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.wire import AckStatus, ResidencyState

THROTTLE_SPEED = 0.5
"""A throttled machine serves at half speed."""
THROTTLE_DERATING = 0.1
"""…and withholds a tenth of its memory for heat (reported as thermal derating)."""
BASE_DISK_USED_MB = 20_000
"""Operating system and tools: disk no artifact can use."""
CAPABILITIES = ("load", "warm", "drain", "unload", "evict")


@dataclass(frozen=True)
class Order:
    """One mutation for one simulated node (a controller command or a baseline's order)."""

    action_id: str
    kind: str
    host_id: str
    model_id: str
    memory_mb: int = 0
    runtime: str | None = None
    reason: str = ""
    """``eviction`` marks an explicit higher-priority preemption (allowed to remove the last
    replica of the lower-priority victim: specification, safety invariant 3)."""


@dataclass(frozen=True)
class Ack:
    """A simulated node's report on one order (``succeeded``, ``failed``, ``rejected``,
    ``running``) with a short reason."""

    action_id: str
    status: AckStatus
    message: str = ""
    artifact_fetched: bool = False


@dataclass
class SimResidency:
    """One model on one simulated node (times in simulated Unix seconds)."""

    model_id: str
    memory_mb: int
    state: ResidencyState
    loaded_at: float
    runtime: str | None
    ready_tick: int
    last_used_at: float | None = None
    active: int = 0
    queue: int = 0
    unload_after: float | None = None
    """A deferred removal: the node unloads at this time (minimum-residency fence)."""
    unload_action: str | None = None
    warm_action: str | None = None


@dataclass
class SimNode:
    """One logical machine's physical state."""

    machine: Machine
    online: bool = True
    last_heartbeat: float = 0.0
    throttled: bool = False
    residencies: dict[str, SimResidency] = field(default_factory=dict)
    cached: dict[str, str | None] = field(default_factory=dict)
    disk_used_mb: int = BASE_DISK_USED_MB
    pending_acks: list[Ack] = field(default_factory=list)
    predictive: dict[str, float] = field(default_factory=dict)
    """Provenance of cache-only predictive downloads not started since (model → finished at)."""
    fresh_downloads: set[str] = field(default_factory=set)
    """Artifacts fetched for a start that has not happened yet (a later start is a cache
    miss; any other start of a cached artifact is a cache hit)."""

    @property
    def host_id(self) -> str:
        """Stable host id."""
        return self.machine.host_id

    @property
    def allocatable_mb(self) -> int:
        """Memory a resident model may use now (MB)."""
        k = self.machine.kind
        derate = int(k.capacity_mb * THROTTLE_DERATING) if self.throttled else 0
        return k.capacity_mb - k.reserved_mb - derate

    @property
    def speed(self) -> float:
        """Relative speed now (throttling halves it)."""
        return self.machine.kind.speed * (THROTTLE_SPEED if self.throttled else 1.0)

    def used_mb(self) -> int:
        """Memory held by residencies (MB)."""
        return sum(r.memory_mb for r in self.residencies.values())


@dataclass
class FleetCounters:
    """Lifecycle and safety counters the report reads (monotonic over the run)."""

    loads: int = 0
    cache_hits: int = 0
    downloads: int = 0
    downloaded_mb: int = 0
    unloads: int = 0
    deferred_unloads: int = 0
    evictions: int = 0
    preemptions: int = 0
    """Explicit preemptions that removed the last ready replica of an in-use model."""
    refused: dict[str, int] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
    violation_samples: list[str] = field(default_factory=list)
    transitions: list[tuple[int, str, str, str]] = field(default_factory=list)
    """(tick, host, model, what) for the timeline: load, ready, drain, unload, deferred…"""


MAX_VIOLATION_SAMPLES = 20
"""Violations listed by example in the report; the counts are always complete."""


class SimFleet:
    """Every simulated node, the seeded events, and the safety audit."""

    def __init__(
        self,
        machines: tuple[Machine, ...],
        catalog: tuple[CatalogEntry, ...],
        events: FleetEvents,
        start: float,
    ) -> None:
        self.start = start
        self.events = events
        self.entries = {e.model_id: e for e in catalog}
        self.nodes: dict[str, SimNode] = {}
        for m in machines:
            node = SimNode(m, last_heartbeat=start)
            for mid in m.cached:
                entry = self.entries[mid]
                node.cached[mid] = entry.profile.artifact_sha256
                node.disk_used_mb += entry.profile.artifact_size_mb or 0
            self.nodes[m.host_id] = node
        self.counters = FleetCounters()
        self.tick = 0
        self.demanded: set[str] = set()
        """Models that served or were asked for in the last minute (last-replica audit)."""

    # --- time ------------------------------------------------------------------------------
    def advance(self, tick: int) -> list[str]:
        """Move to ``tick``: events, load completions, deferred removals.

        Returns:
            Node transitions of this tick (``down``, ``up``, ``throttled``, ``cooled``).
        """
        self.tick = tick
        now = self.now
        changes: list[str] = []
        t0, t1 = self.events.throttle_ticks
        o0, o1 = self.events.outage_ticks
        for node in self.nodes.values():
            hot = node.host_id in self.events.throttled and t0 <= tick < t1
            if hot != node.throttled:
                node.throttled = hot
                changes.append(f"{node.host_id}:{'throttled' if hot else 'cooled'}")
            down = node.host_id in self.events.outage and o0 <= tick < o1
            if down and node.online:
                node.online = False
                lost = sorted(node.residencies)
                node.residencies.clear()  # processes die with the machine; the disk survives
                node.pending_acks.clear()
                changes.append(f"{node.host_id}:down" + (f" lost {','.join(lost)}" if lost else ""))
            elif not down and not node.online:
                node.online = True
                changes.append(f"{node.host_id}:up")
            if node.online:
                node.last_heartbeat = now
                self._materialize(node, tick, now)
        return changes

    @property
    def now(self) -> float:
        """Simulated wall-clock seconds of the current tick."""
        return self.start + self.tick * TICK_S

    def _materialize(self, node: SimNode, tick: int, now: float) -> None:
        for r in list(node.residencies.values()):
            if r.state == "loading" and tick >= r.ready_tick:
                r.state = "ready"
                self._log(node.host_id, r.model_id, "ready")
                if r.warm_action:
                    node.pending_acks.append(Ack(r.warm_action, "succeeded", "ready"))
            if r.unload_after is not None and now >= r.unload_after:
                del node.residencies[r.model_id]
                self.counters.unloads += 1
                self._log(node.host_id, r.model_id, "unload")
                if r.unload_action:
                    node.pending_acks.append(Ack(r.unload_action, "succeeded", "unloaded"))

    def _log(self, host: str, model: str, what: str) -> None:
        self.counters.transitions.append((self.tick, host, model, what))

    # --- orders ----------------------------------------------------------------------------
    def apply(self, order: Order, profiles: dict[str, ModelProfile]) -> Ack:
        """Carry out one order the way a managed node would, refusing what it would refuse."""
        node = self.nodes.get(order.host_id)
        if node is None or not node.online:
            return Ack(order.action_id, "failed", "node is down")
        profile = profiles.get(order.model_id)
        if profile is None:
            return self._refuse(order, "unknown_model", "model is not configured")
        handler = {
            "load": self._load,
            "warm": self._warm,
            "drain": self._drain,
            "unload": self._unload,
            "evict": self._evict,
        }.get(order.kind)
        if handler is None:
            return self._refuse(order, "unknown_action", f"unknown action {order.kind}")
        return handler(node, order, profile)

    def _refuse(self, order: Order, code: str, message: str, violation: bool = False) -> Ack:
        self.counters.refused[code] = self.counters.refused.get(code, 0) + 1
        if violation:
            self._violate(
                code,
                f"tick {self.tick}: {order.kind} {order.model_id} on {order.host_id}: {message}",
            )
        return Ack(order.action_id, "rejected", message)

    def _violate(self, code: str, sample: str) -> None:
        self.counters.violations[code] = self.counters.violations.get(code, 0) + 1
        if len(self.counters.violation_samples) < MAX_VIOLATION_SAMPLES:
            self.counters.violation_samples.append(sample)

    def _load(self, node: SimNode, order: Order, profile: ModelProfile) -> Ack:
        """Acquire the artifact (download unless cached); holds disk, not memory."""
        if order.model_id in node.cached:
            return Ack(order.action_id, "succeeded", "artifact already cached")
        kind = node.machine.kind
        if not self._compatible(node, profile):
            return self._refuse(
                order, "ineligible_placement", "runtime/backend/GPU mismatch", violation=True
            )
        size = profile.artifact_size_mb or 0
        if node.disk_used_mb + size > kind.disk_mb:
            return self._refuse(order, "disk_full", f"{size} MB artifact does not fit")
        node.disk_used_mb += size
        node.cached[order.model_id] = profile.artifact_sha256
        node.fresh_downloads.add(order.model_id)
        if order.reason == PREDICTIVE_FETCH:
            node.predictive[order.model_id] = self.now
        self.counters.downloads += 1
        self.counters.downloaded_mb += size
        return Ack(order.action_id, "succeeded", "artifact fetched", artifact_fetched=True)

    def _compatible(self, node: SimNode, profile: ModelProfile) -> bool:
        kind = node.machine.kind
        runtimes = [r for r in profile.runtimes if r in kind.runtimes]
        return bool(runtimes) and not (
            (profile.backends and not set(profile.backends) & set(kind.backends))
            or (profile.min_gpu_count and kind.gpu_memory_mb < profile.min_gpu_memory_mb)
        )

    def _warm(self, node: SimNode, order: Order, profile: ModelProfile) -> Ack:
        """Start the engine: READY one tick later; memory and the model slot are taken now."""
        r = node.residencies.get(order.model_id)
        if r is not None and r.state != "draining":
            return Ack(order.action_id, "succeeded", r.state)
        if not self._compatible(node, profile):
            return self._refuse(
                order, "ineligible_placement", "runtime/backend/GPU mismatch", violation=True
            )
        if order.model_id not in node.cached:
            return self._refuse(order, "not_cached", "warm before the artifact was loaded")
        if r is not None:  # draining here: the node will not restart it mid-drain
            return self._refuse(order, "draining_here", "model is draining on this node")
        runtimes = [rt for rt in profile.runtimes if rt in node.machine.kind.runtimes]
        memory = profile.memory_for(runtimes)
        if node.used_mb() + memory > node.allocatable_mb:
            return self._refuse(order, "overcommit", f"{memory} MB does not fit", violation=True)
        if len(node.residencies) >= 1:  # one-model logical machine: the slot is taken
            return self._refuse(order, "overcommit", "model slot is taken", violation=True)
        node.predictive.pop(order.model_id, None)  # used: ordinary cache from now on
        if order.model_id in node.fresh_downloads:
            node.fresh_downloads.discard(order.model_id)
        else:
            self.counters.cache_hits += 1
        runtime = order.runtime if order.runtime in runtimes else runtimes[0]
        node.residencies[order.model_id] = SimResidency(
            order.model_id,
            memory,
            "loading",
            self.now,
            runtime,
            self.tick + 1,
            warm_action=order.action_id,
        )
        self.counters.loads += 1
        self._log(node.host_id, order.model_id, "load")
        return Ack(order.action_id, "running", "starting; ready next tick")

    def _drain(self, node: SimNode, order: Order, profile: ModelProfile) -> Ack:
        r = node.residencies.get(order.model_id)
        if r is None:
            return Ack(order.action_id, "succeeded", "not resident")
        self._audit_last_replica(node, r, order)
        if r.state != "draining":
            r.state = "draining"
            self._log(node.host_id, r.model_id, "drain")
        return Ack(order.action_id, "succeeded", "draining")

    def _unload(self, node: SimNode, order: Order, profile: ModelProfile) -> Ack:
        r = node.residencies.get(order.model_id)
        if r is None:
            return Ack(order.action_id, "succeeded", "not resident")
        if r.state != "draining":
            self._audit_last_replica(node, r, order)
            r.state = "draining"
        fence = r.loaded_at + profile.min_residency_s
        if self.now < fence:
            # The node's minimum-residency fence: the model stays (draining, still holding
            # memory and its slot) until the fence passes, then the removal materialises.
            if r.unload_after is None:
                self.counters.deferred_unloads += 1
                self._log(node.host_id, r.model_id, "deferred")
            r.unload_after = fence
            r.unload_action = order.action_id
            return Ack(order.action_id, "running", "deferred by minimum residency")
        del node.residencies[order.model_id]
        self.counters.unloads += 1
        self._log(node.host_id, order.model_id, "unload")
        return Ack(order.action_id, "succeeded", "unloaded")

    def _evict(self, node: SimNode, order: Order, profile: ModelProfile) -> Ack:
        if order.model_id in node.residencies:
            return self._refuse(order, "evict_resident", "artifact is in use")
        if order.model_id in node.cached:
            del node.cached[order.model_id]
            node.predictive.pop(order.model_id, None)
            node.disk_used_mb -= profile.artifact_size_mb or 0
            self.counters.evictions += 1
        return Ack(order.action_id, "succeeded", "evicted")

    def _audit_last_replica(self, node: SimNode, r: SimResidency, order: Order) -> None:
        """Removing the last READY replica of a model in use is a violation, unless it is an
        explicit higher-priority preemption (counted separately)."""
        if r.state != "ready" or r.model_id not in self.demanded:
            return
        if order.reason == "eviction":
            self.counters.preemptions += 1
            return
        others = [
            h
            for h, n in self.nodes.items()
            if h != node.host_id
            and n.online
            and (o := n.residencies.get(r.model_id)) is not None
            and o.state == "ready"
        ]
        if not others:
            self._violate(
                "last_replica_loss",
                f"tick {self.tick}: removed the last ready "
                f"replica of {r.model_id} (on {node.host_id}) while it was in use",
            )

    def take_acks(self, host_id: str) -> list[Ack]:
        """Acknowledgements a node sends with its next heartbeat (and forgets)."""
        node = self.nodes[host_id]
        acks, node.pending_acks = node.pending_acks, []
        return acks

    # --- what the controller sees ----------------------------------------------------------
    def snapshots(self) -> tuple[HostSnapshot, ...]:
        """One snapshot per machine; a down machine's last report ages (it stops beating)."""
        return tuple(
            self._snapshot(n) for n in sorted(self.nodes.values(), key=lambda n: n.host_id)
        )

    def _snapshot(self, node: SimNode) -> HostSnapshot:
        k = node.machine.kind
        residencies = tuple(
            ResidencySnapshot(
                model_id=r.model_id,
                memory_mb=r.memory_mb,
                state=r.state,
                active_requests=r.active,
                max_concurrency=self._slots(node, r.model_id),
                queue_depth=r.queue,
                loaded_at=r.loaded_at,
                last_used_at=r.last_used_at,
                artifact_sha256=self.entries[r.model_id].profile.artifact_sha256,
                runtime=r.runtime,
                routable=r.state == "ready" and node.online,
            )
            for r in sorted(node.residencies.values(), key=lambda r: r.model_id)
        )
        return HostSnapshot(
            host_id=node.host_id,
            capacity_mb=k.capacity_mb,
            reserved_mb=k.reserved_mb,
            state="throttled" if node.throttled else "accepting",
            heartbeat_age_s=round(self.now - node.last_heartbeat, 3),
            runtimes=k.runtimes,
            backends=k.backends,
            tags=k.tags,
            failure_domain=node.machine.failure_domain,
            max_models=1,
            gpu_count=1 if k.gpu_memory_mb else 0,
            gpu_memory_mb=k.gpu_memory_mb,
            artifact_disk_free_mb=max(0, k.disk_mb - node.disk_used_mb),
            artifact_disk_total_mb=k.disk_mb,
            throttle_fraction=0.5 if node.throttled else 1.0,
            thermal_derating=THROTTLE_DERATING if node.throttled else 0.0,
            concurrency=k.concurrency,
            queue_depth=sum(r.queue for r in node.residencies.values()),
            residencies=residencies,
            cached=dict(sorted(node.cached.items())),
            predictive_cached=dict(sorted(node.predictive.items())),
            actuator_capabilities=CAPABILITIES,
        )

    def _slots(self, node: SimNode, model_id: str) -> int:
        return min(
            node.machine.kind.concurrency, self.entries[model_id].profile.replica_concurrency
        )

    # --- the audit that does not depend on orders --------------------------------------------
    def audit_memory(self) -> None:
        """Count any machine whose residencies exceed capacity minus reserve (overcommit).

        Thermal derating that shrinks room under an existing model is pressure, not a
        placement decision, so it is not counted here.
        """
        for node in self.nodes.values():
            k = node.machine.kind
            room = k.capacity_mb - k.reserved_mb
            if node.online and node.used_mb() > room:
                self._violate(
                    "overcommit",
                    f"tick {self.tick}: {node.host_id} holds "
                    f"{node.used_mb()} MB of {room} MB allocatable",
                )
