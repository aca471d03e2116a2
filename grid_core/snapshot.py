"""Host snapshots: the planner's immutable view of one physical host at one instant.

The controller builds these from registry records (several engine records of one machine
merge by ``host_id`` without multiplying its memory). Everything the placement rules need is
here; nothing here is read from a clock. Unknown is ``None``, never zero.
"""

from __future__ import annotations

import msgspec

from grid_core.wire import HostState, Ownership, ResidencyState


class ResidencySnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One model on one host as the planner sees it (times are server-clock Unix seconds)."""

    model_id: str
    memory_mb: int
    state: ResidencyState
    ownership: Ownership = "managed"
    active_requests: int | None = None
    """``None`` = unknown; unknown activity never authorises an unload."""
    max_concurrency: int | None = None
    queue_depth: int = 0
    loaded_at: float | None = None
    last_used_at: float | None = None
    artifact_sha256: str | None = None
    runtime: str | None = None
    routable: bool = False
    """Corroborated by a live, admitted engine record (READY claims alone are not proof)."""
    route_age_s: float | None = None
    """Seconds since the corroborating engine route last refreshed its own lease (server
    clock); ``None`` when not routable. The final destructive check needs the route itself,
    not only its host's control record, to have lease left."""
    predictive: bool = False

    @property
    def holds_memory(self) -> bool:
        """Loading, warming, ready, draining and failed residencies hold (or may hold) memory."""
        return self.state != "cached"

    @property
    def actuatable(self) -> bool:
        """Only managed residencies are ever loaded, drained or unloaded by Grid."""
        return self.ownership == "managed"


class ModelPerformance(msgspec.Struct, frozen=True, kw_only=True):
    """Server-owned measurements of one model on one host (override self-reports).

    Attributes:
        latency_ms: EWMA end-to-end latency.
        tokens_per_s: EWMA completion-token throughput.
        samples: effective sample count (confidence ramps to full at 8).
        warm_s / load_s / fetch_s: learned lifecycle durations (EWMA, 8 samples,
            authoritative after 4), keyed to the artifact revision by the controller.
    """

    latency_ms: float | None = None
    tokens_per_s: float | None = None
    samples: float = 0.0
    warm_s: float | None = None
    load_s: float | None = None
    fetch_s: float | None = None


class HostSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One host's facts for planning (memory and disk in MB, ages in seconds)."""

    host_id: str
    capacity_mb: int
    reserved_mb: int = 0
    state: HostState = "accepting"
    healthy: bool = True
    """False when the last report had malformed rows or an invalid lifecycle (fail closed)."""
    authenticated: bool = True
    heartbeat_age_s: float | None = None
    """Seconds since the last heartbeat (server clock); ``None`` = never; negative = future."""
    runtimes: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    data_tiers: tuple[str, ...] = ()
    failure_domain: str | None = None
    max_models: int = 0
    """Ceiling on models resident at once; 0 = no ceiling."""
    gpu_count: int = 0
    gpu_memory_mb: int = 0
    """Memory of the smallest GPU (per-device VRAM), 0 when none."""
    memory_bandwidth_gbps: float | None = None
    compute_gflops: float | None = None
    artifact_disk_free_mb: int | None = None
    artifact_disk_total_mb: int | None = None
    external_used_mb: int = 0
    """Memory used by unmanaged processes not listed as residencies."""
    throttle_fraction: float = 1.0
    thermal_derating: float = 0.0
    concurrency: int | None = None
    queue_depth: int = 0
    host_priority: int = 0
    residencies: tuple[ResidencySnapshot, ...] = ()
    cached: dict[str, str | None] = {}
    """Model id → artifact SHA-256 (``None`` when unknown) of weights cached on disk."""
    predictive_cached: dict[str, float] = {}
    """Model id → when the node finished a cache-only predictive download of it that has not
    been started since (server-clock Unix seconds): the node's provenance, so the predictive
    cache lifecycle touches only these (never operator caches or used downloads)."""
    performance: dict[str, ModelPerformance] = {}
    actuator_capabilities: tuple[str, ...] = ()

    @property
    def allocatable_mb(self) -> int:
        """Raw allocatable memory: capacity minus reserve minus thermal derating (MB)."""
        raw = self.capacity_mb - self.reserved_mb
        return max(0, int(raw - self.capacity_mb * self.thermal_derating))

    def residency(self, model_id: str) -> ResidencySnapshot | None:
        """The residency of ``model_id`` on this host, if any."""
        for r in self.residencies:
            if r.model_id == model_id:
                return r
        return None
