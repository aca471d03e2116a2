"""Registry records → host snapshots (pure: the server passes records, measurements and ``now``).

Source: the specification's "Local wire contract" (records merged by stable host_id, READY
corroborated by a live engine route, receipt-time timestamps, fail closed on rejected rows)
and "Global placement loop" (server-owned measurements override self-reports).

One physical machine may hold several registry records: one control record (role
``allocator``) carrying capacity and the allocator envelope, and one engine record per ready
engine child. Capacity comes only from the control record, so a machine's memory is counted
once however many engines it runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from grid_core.routing import Measurement, effective_samples, latency_confidence
from grid_core.snapshot import HostSnapshot, ModelPerformance, ResidencySnapshot
from grid_core.wire import AllocatorEnvelope, Load, Residency, Resources

LEASE_TTL_S = 60.0
"""A record not refreshed for a minute is expired: it neither routes nor counts as capacity."""

Role = Literal["allocator", "engine"]

INSTANCE_LAPSE_S = LEASE_TTL_S
"""Seconds after the last accepted report of a host's agent instance during which another
instance under the same host id is refused. Equal to the record lease: while the first
agent's control record is live it is still the host the controller plans for, and the
slowest allowed heartbeat (30 s, ``grid_core.nodeconfig``) keeps a running agent well inside
it. A crashed agent's replacement waits at most this long."""

InstanceVerdict = Literal["accept", "take_over", "held", "superseded"]


class InstanceClaim(msgspec.Struct, frozen=True, kw_only=True):
    """Which node-agent run speaks for a host id on this server.

    Attributes:
        instance_id: the random per-run id the agent sends (``instance_id`` on the wire).
        last_seen: server wall-clock seconds of its last accepted registration or heartbeat.
    """

    instance_id: str
    last_seen: float


def instance_verdict(
    current: InstanceClaim | None,
    incoming: str | None,
    now: float,
    *,
    registration: bool,
    replaces: str | None = None,
) -> InstanceVerdict:
    """Decide whether a report from agent run ``incoming`` is accepted for its host id.

    Args:
        current: the run that holds the host id, or ``None`` when none does.
        incoming: the sender's instance id; ``None`` for an agent that sends none (older
            agents keep working unchecked, the wire contract being additive).
        now: server wall-clock seconds.
        registration: a registration (which may take an idle host id over) rather than a
            heartbeat or removal (which never do).
        replaces: a registration's predecessor on the same state directory (whose lock
            proves that run has ended); naming the holder takes the host id over at once.

    Returns:
        ``accept`` (the holder itself, or an unchecked sender), ``take_over`` (no run
        holds the id, a registration that replaces the holder, or one after the holder
        stayed silent for :data:`INSTANCE_LAPSE_S`), ``held`` (a registration from another
        run while the holder still reports) or ``superseded`` (a heartbeat or removal from a
        run that no longer holds the id).

    Source: one node agent per host id (docs/node.md, "Start, inspect, stop"): memory, owner
    protection and last-replica accounting are per host, so two runs under one id would each
    act on facts the controller believes are one machine's.
    """
    if incoming is None:
        return "accept"
    if current is None:
        return "take_over"
    if current.instance_id == incoming:
        return "accept"
    if not registration:
        return "superseded"
    if replaces == current.instance_id or now - current.last_seen >= INSTANCE_LAPSE_S:
        return "take_over"
    return "held"


class RegistryRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One registry record as the server stores it (no secrets: keys live elsewhere).

    Attributes:
        record_id: derived registry id (``ctl.<host>`` or ``eng.<host>.<digest>``).
        role: ``allocator`` (a host's control record) or ``engine`` (one ready engine).
        host_id: the authenticated stable host id.
        models: models ready and routable on this record now.
        url: engine base URL (engine records).
        resources: the host's capacity facts (control records).
        allocator: the allocator envelope (control records).
        load: the last reported load.
        received_at: server wall-clock seconds of the last registration or heartbeat.
        lease_expires_at: server wall-clock seconds when the record expires.
        rejected_rows: malformed residency rows dropped from the last report.
        advertise_host: see the attribute.
    """

    record_id: str
    role: Role
    host_id: str
    models: tuple[str, ...] = ()
    url: str | None = None
    resources: Resources | None = None
    allocator: AllocatorEnvelope | None = None
    load: Load | None = None
    received_at: float = 0.0
    lease_expires_at: float = 0.0
    rejected_rows: tuple[str, ...] = ()
    advertise_host: str | None = None
    """Control records: the address the node's engines are reached at (``None``: loopback)."""

    def live(self, now: float) -> bool:
        """True while the lease has not expired."""
        return now < self.lease_expires_at


MeasurementKey = tuple[str, str]
"""(host_id, model_id) of a server-owned measurement."""


def _residency(
    raw: Residency, received_at: float, routable_models: Mapping[str, float], now: float
) -> ResidencySnapshot:
    # Ages are relative to the sender's clock; rebuilding from the server's receipt time
    # means node clock skew cannot stretch minimum residency or cooldowns.
    loaded_at = (
        received_at - raw.loaded_age_s
        if raw.loaded_age_s is not None
        else _clamp(raw.loaded_at, received_at)
    )
    last_used = (
        received_at - raw.last_used_age_s
        if raw.last_used_age_s is not None
        else _clamp(raw.last_used_at, received_at)
    )
    routable = raw.state == "ready" and raw.model_id in routable_models
    return ResidencySnapshot(
        model_id=raw.model_id,
        memory_mb=raw.memory_mb,
        state=raw.state,
        ownership=raw.effective_ownership,
        active_requests=raw.active_requests,
        max_concurrency=raw.max_concurrency,
        queue_depth=raw.queue_depth,
        loaded_at=loaded_at,
        last_used_at=last_used,
        artifact_sha256=raw.artifact_sha256,
        runtime=raw.runtime,
        routable=routable,
        route_age_s=now - routable_models[raw.model_id] if routable else None,
        predictive=raw.predictive,
    )


def _clamp(ts: float | None, received_at: float) -> float | None:
    """A self-reported absolute time is never allowed to lie in the server's future."""
    return None if ts is None else min(ts, received_at)


def _performance(
    host_id: str,
    residencies: Iterable[ResidencySnapshot],
    measurements: Mapping[MeasurementKey, Measurement],
    now: float,
) -> dict[str, ModelPerformance]:
    out: dict[str, ModelPerformance] = {}
    for r in residencies:
        m = measurements.get((host_id, r.model_id))
        if m is None or latency_confidence(m, now) <= 0:
            continue
        # Evidence bound to another artifact revision says nothing about this one.
        if r.artifact_sha256 is not None and m.artifact_sha256 != r.artifact_sha256:
            continue
        out[r.model_id] = ModelPerformance(
            latency_ms=m.latency_ms,
            tokens_per_s=m.tokens_per_s,
            samples=effective_samples(m, now),
        )
    return out


def build_host_snapshots(
    records: Iterable[RegistryRecord],
    now: float,
    measurements: Mapping[MeasurementKey, Measurement] | None = None,
) -> tuple[HostSnapshot, ...]:
    """Merge live registry records by host into planner snapshots (sorted by host id).

    Args:
        records: every registry record (expired ones are ignored).
        now: server wall-clock seconds.
        measurements: server-owned EWMAs by (host_id, model_id); they override anything the
            host says about its own performance.

    Returns:
        One snapshot per host that has a live control record. A host that only has engine
        records (no control record) is reported unhealthy with zero capacity: it routes, but
        placement may not use it.

    Failing closed: rejected residency rows, a missing allocator envelope or a missing
    resources block make the snapshot unhealthy; a READY residency is routable only when a
    live engine record of the same host lists the model.
    """
    measurements = measurements or {}
    by_host: dict[str, list[RegistryRecord]] = {}
    for rec in records:
        if rec.live(now):
            by_host.setdefault(rec.host_id, []).append(rec)
    out: list[HostSnapshot] = []
    for host_id in sorted(by_host):
        recs = by_host[host_id]
        control = next((r for r in recs if r.role == "allocator"), None)
        engines = [r for r in recs if r.role == "engine"]
        # Model → receipt time of the freshest live engine route listing it.
        routable: dict[str, float] = {}
        for e in engines:
            for m in e.models:
                routable[m] = max(routable.get(m, e.received_at), e.received_at)
        out.append(_snapshot(host_id, control, routable, measurements, now))
    return tuple(out)


def _snapshot(
    host_id: str,
    control: RegistryRecord | None,
    routable: Mapping[str, float],
    measurements: Mapping[MeasurementKey, Measurement],
    now: float,
) -> HostSnapshot:
    if control is None:
        residencies = tuple(
            ResidencySnapshot(
                model_id=m, memory_mb=0, state="ready", ownership="external", routable=True
            )
            for m in sorted(routable)
        )
        return HostSnapshot(
            host_id=host_id,
            capacity_mb=0,
            healthy=False,
            state="unhealthy",
            residencies=residencies,
        )
    res = control.resources
    env = control.allocator
    healthy = res is not None and env is not None and not control.rejected_rows
    rows = [
        _residency(r, control.received_at, routable, now) for r in (env.residencies if env else [])
    ]
    listed = {r.model_id for r in rows}
    # Engines the control record does not list are someone else's (external) routes.
    rows += [
        ResidencySnapshot(
            model_id=m, memory_mb=0, state="ready", ownership="external", routable=True
        )
        for m in sorted(set(routable) - listed)
    ]
    cached: dict[str, str | None] = {}
    if env is not None:
        for m in env.cached_models:
            cached.setdefault(m, None)
        for a in env.cached_artifacts:
            cached[a.model_id] = a.artifact_sha256
    predictive = {
        a.model_id: control.received_at - a.cached_age_s
        for a in (env.cached_artifacts if env is not None else [])
        if a.predictive and a.cached_age_s is not None and a.artifact_sha256
    }
    conc = [r.max_concurrency for r in rows if r.state == "ready" and r.max_concurrency]
    gpus = res.gpus if res else []
    load = control.load
    return HostSnapshot(
        host_id=host_id,
        capacity_mb=res.capacity_mb if res else 0,
        reserved_mb=res.reserved_mb if res else 0,
        state=env.state if env else "unhealthy",
        healthy=healthy,
        heartbeat_age_s=now - control.received_at,
        runtimes=tuple(res.runtimes) if res else (),
        backends=tuple(res.backends) if res else (),
        tags=tuple(res.tags) if res else (),
        data_tiers=tuple(res.data_tiers) if res else (),
        failure_domain=res.failure_domain if res else None,
        max_models=res.max_models if res else 0,
        gpu_count=len(gpus),
        gpu_memory_mb=min((g.memory_total_mb for g in gpus), default=0),
        memory_bandwidth_gbps=res.memory_bandwidth_gbps if res else None,
        compute_gflops=res.compute_gflops if res else None,
        artifact_disk_free_mb=res.artifact_disk_free_mb if res else None,
        artifact_disk_total_mb=res.artifact_disk_total_mb if res else None,
        external_used_mb=res.external_used_mb if res else 0,
        throttle_fraction=res.throttle_fraction if res else 1.0,
        thermal_derating=res.thermal_derating if res else 0.0,
        concurrency=sum(conc) if conc else None,
        queue_depth=load.queue_depth if load else 0,
        residencies=tuple(rows),
        cached=cached,
        predictive_cached=predictive,
        performance=_performance(host_id, rows, measurements, now),
        actuator_capabilities=tuple(env.actuator_capabilities) if env else (),
    )
