"""Registry records → host snapshots: merge by host, fail closed, receipt-time clocks."""

from __future__ import annotations

from grid_core.hosts import LEASE_TTL_S, RegistryRecord, build_host_snapshots
from grid_core.routing import record_sample
from grid_core.wire import AllocatorEnvelope, Residency, Resources

NOW = 1_800_000_000.0
SHA_A = "a" * 64


def control(
    host: str,
    residencies: list[Residency] | None = None,
    *,
    received: float = NOW,
    rejected: tuple[str, ...] = (),
    envelope: bool = True,
) -> RegistryRecord:
    return RegistryRecord(
        record_id=f"ctl.{host}",
        role="allocator",
        host_id=host,
        resources=Resources(capacity_mb=65536, reserved_mb=8192, runtimes=["llama.cpp"]),
        allocator=AllocatorEnvelope(residencies=residencies or []) if envelope else None,
        received_at=received,
        lease_expires_at=received + LEASE_TTL_S,
        rejected_rows=rejected,
    )


def engine(host: str, model: str, *, received: float = NOW) -> RegistryRecord:
    return RegistryRecord(
        record_id=f"eng.{host}.{model}",
        role="engine",
        host_id=host,
        models=(model,),
        url="http://127.0.0.1:1",
        received_at=received,
        lease_expires_at=received + LEASE_TTL_S,
    )


def ready(model: str, **kw: object) -> Residency:
    return Residency(model_id=model, memory_mb=4096, state="ready", **kw)  # type: ignore[arg-type]


def test_many_engine_records_do_not_multiply_memory() -> None:
    recs = [control("h1", [ready("a"), ready("b")]), engine("h1", "a"), engine("h1", "b")]
    (snap,) = build_host_snapshots(recs, NOW)
    assert snap.capacity_mb == 65536
    assert snap.reserved_mb == 8192
    assert {r.model_id for r in snap.residencies} == {"a", "b"}


def test_ready_is_routable_only_with_a_live_engine_record() -> None:
    recs = [
        control("h1", [ready("a"), ready("b")]),
        engine("h1", "a"),
        engine("h1", "b", received=NOW - LEASE_TTL_S - 1),
    ]
    (snap,) = build_host_snapshots(recs, NOW)
    routable = {r.model_id: r.routable for r in snap.residencies}
    assert routable == {"a": True, "b": False}


def test_engine_record_of_another_host_does_not_corroborate() -> None:
    recs = [control("h1", [ready("a")]), control("h2"), engine("h2", "a")]
    snaps = {s.host_id: s for s in build_host_snapshots(recs, NOW)}
    assert snaps["h1"].residency("a").routable is False  # type: ignore[union-attr]


def test_rejected_rows_or_missing_envelope_fail_closed() -> None:
    (bad,) = build_host_snapshots([control("h1", rejected=("row 0: bad",))], NOW)
    assert bad.healthy is False
    (bare,) = build_host_snapshots([control("h1", envelope=False)], NOW)
    assert bare.healthy is False and bare.state == "unhealthy"


def test_engine_only_host_is_unhealthy_with_zero_capacity() -> None:
    (snap,) = build_host_snapshots([engine("ext", "m")], NOW)
    assert snap.capacity_mb == 0 and not snap.healthy
    assert snap.residency("m").ownership == "external"  # type: ignore[union-attr]


def test_expired_records_are_ignored() -> None:
    assert build_host_snapshots([control("h1", received=NOW - LEASE_TTL_S)], NOW) == ()


def test_heartbeat_age_and_timestamps_come_from_server_receipt() -> None:
    rec = control(
        "h1",
        [ready("a", loaded_age_s=100.0, last_used_age_s=5.0, loaded_at=NOW + 10_000)],
        received=NOW - 7,
    )
    (snap,) = build_host_snapshots([rec, engine("h1", "a")], NOW)
    assert snap.heartbeat_age_s == 7
    r = snap.residency("a")
    assert r is not None
    assert r.loaded_at == NOW - 7 - 100.0  # the node's absolute clock is ignored
    assert r.last_used_at == NOW - 7 - 5.0


def test_absolute_times_are_clamped_to_receipt() -> None:
    rec = control("h1", [ready("a", loaded_at=NOW + 3600)])
    (snap,) = build_host_snapshots([rec], NOW)
    assert snap.residency("a").loaded_at == NOW  # type: ignore[union-attr]


def test_server_measurements_become_performance_and_respect_artifact() -> None:
    m = record_sample(None, NOW, 250.0, 100, 2.0, artifact_sha256=SHA_A)
    rows = [ready("a", artifact_sha256=SHA_A), ready("b", artifact_sha256="b" * 64)]
    recs = [control("h1", rows), engine("h1", "a"), engine("h1", "b")]
    (snap,) = build_host_snapshots(recs, NOW, {("h1", "a"): m, ("h1", "b"): m})
    assert snap.performance["a"].latency_ms == 250.0
    assert snap.performance["a"].tokens_per_s == 50.0
    assert "b" not in snap.performance  # evidence for another revision is not lent


def test_cached_artifacts_and_gpus_are_carried() -> None:
    from grid_core.wire import CachedArtifact, GpuDevice

    rec = RegistryRecord(
        record_id="ctl.h1",
        role="allocator",
        host_id="h1",
        resources=Resources(
            capacity_mb=1000,
            gpus=[
                GpuDevice(index=0, memory_total_mb=8000),
                GpuDevice(index=1, memory_total_mb=6000),
            ],
        ),
        allocator=AllocatorEnvelope(
            cached_models=["x"],
            cached_artifacts=[CachedArtifact(model_id="y", artifact_sha256=SHA_A)],
        ),
        received_at=NOW,
        lease_expires_at=NOW + 60,
    )
    (snap,) = build_host_snapshots([rec], NOW)
    assert snap.cached == {"x": None, "y": SHA_A}
    assert snap.gpu_count == 2 and snap.gpu_memory_mb == 6000
