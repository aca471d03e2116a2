"""Builders for reconciler tests: explicit hosts, residencies and hand-built plans."""

from __future__ import annotations

from grid_core.planner.types import Assignment, Eviction, Plan
from grid_core.profile import ModelProfile, validate_profile
from grid_core.reconcile import ActionBook, GovernorPolicy, ReconcileInputs, reconcile
from grid_core.reconcile.reconciler import ReconcileResult
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

NOW = 2_000_000.0


def host(host_id: str, mb: int = 16_000, *res: ResidencySnapshot, **kw: object) -> HostSnapshot:
    base: dict[str, object] = {
        "host_id": host_id,
        "capacity_mb": mb,
        "heartbeat_age_s": 1.0,
        "runtimes": ("llama.cpp",),
        "residencies": tuple(res),
    }
    base.update(kw)
    return HostSnapshot(**base)  # type: ignore[arg-type]


def ready(model_id: str, mb: int = 4000, **kw: object) -> ResidencySnapshot:
    base: dict[str, object] = {
        "model_id": model_id,
        "memory_mb": mb,
        "state": "ready",
        "active_requests": 0,
        "routable": True,
        "loaded_at": NOW - 3600.0,
    }
    base.update(kw)
    return ResidencySnapshot(**base)  # type: ignore[arg-type]


def profile(model_id: str, mb: int = 4000, **kw: object) -> ModelProfile:
    base: dict[str, object] = {"model_id": model_id, "memory_mb": mb}
    base.update(kw)
    return validate_profile(ModelProfile(**base))  # type: ignore[arg-type]


def plan(
    placement: dict[str, list[str]],
    mb: int = 4000,
    evictions: tuple[Eviction, ...] = (),
    desired: dict[str, int] | None = None,
) -> Plan:
    assigned = tuple(
        Assignment(
            model_id=m,
            host_id=h,
            incumbent=False,
            runtime="llama.cpp",
            memory_mb=mb,
            reason="score",
        )
        for m, hs in sorted(placement.items())
        for h in hs
    )
    return Plan(
        assignments=assigned,
        desired=desired if desired is not None else {m: len(h) for m, h in placement.items()},
        evictions=evictions,
        digest="test",
    )


def run(
    p: Plan,
    hosts: list[HostSnapshot],
    profiles: list[ModelProfile],
    book: ActionBook | None = None,
    now: float = NOW,
    **kw: object,
) -> ReconcileResult:
    return reconcile(
        ReconcileInputs(
            now=now,
            plan=p,
            hosts={h.host_id: h for h in hosts},
            profiles={x.model_id: x for x in profiles},
            retired=frozenset(kw.pop("retired", ())),  # type: ignore[arg-type]
            book=book if book is not None else ActionBook(),
            policy=kw.pop("policy", GovernorPolicy()),  # type: ignore
            **kw,
        )
    )  # type: ignore[arg-type]


def kinds(result: ReconcileResult) -> list[tuple[str, str, str]]:
    return [(p.kind, p.host_id, p.model_id) for p in result.proposals]


def deferred(result: ReconcileResult) -> dict[tuple[str, str, str], str]:
    return {(d.kind, d.host_id, d.model_id): d.reason for d in result.deferred}
