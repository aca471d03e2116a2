"""Values and helpers the controller uses around reconciliation (kept out of its class).

Specification: "Local wire contract" (controller lease, delivery), "Reconciliation and
modes" (withdrawn destructive batches and the postconditions that release them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypedDict

import msgspec

from grid_core.demand.series import ForecastPolicy
from grid_core.planner.types import Plan, PlannerPolicy
from grid_core.profile import ModelProfile
from grid_core.reconcile.actions import Action, ActionBook, ServiceClass, action_id
from grid_core.reconcile.authority import CONTROLLER_LEASE_S
from grid_core.reconcile.policy import PENALTY_CAP, GovernorPolicy
from grid_core.reconcile.reconciler import Proposal
from grid_core.reconcile.status import ReconcileReport
from grid_core.reconcile.view import observed_at, reachable
from grid_core.snapshot import HostSnapshot, ModelPerformance, ResidencySnapshot
from grid_core.wire import Command

PERSIST_EVERY_TICKS = 12
"""Outside automatic mode the plan sequence is persisted at least this often (a minute at the
default cadence); profile and mode changes are always written at once."""

FAILURE_PENALTY_S = 120.0
"""Seconds of extra start-up time the planner sees per recent failed load/warm of a model on a
host: two minutes is a clear preference for a healthy peer without hiding the failed host."""

POSTCONDITION = {
    "drain": frozenset({"draining", "cached"}),
    "unload": frozenset({"cached"}),
    "evict": frozenset(),
}
"""Residency states (besides absence) that prove a destructive action's durable effect."""


class ControllerPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Controller tunables: the planner's, the governor's and the demand side's (window,
    bucket width), plus persistence cadence."""

    planner: PlannerPolicy = PlannerPolicy()
    governor: GovernorPolicy = GovernorPolicy()
    forecast: ForecastPolicy = ForecastPolicy()
    persist_every_ticks: int = PERSIST_EVERY_TICKS
    controller_lease_s: float = CONTROLLER_LEASE_S
    """Single-writer lease length in seconds: how long a dead leader's authority outlives it
    (a follower on etcd takes over within about this long)."""


class TickResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one tick produced.

    Attributes:
        generation: ``epoch:sequence:digest`` of the plan.
        plan: the plan.
        reconciliation: proposals, deferrals, withdrawals, holds.
        issued: ids of actions created this tick (automatic mode only).
    """

    generation: str
    plan: Plan
    reconciliation: ReconcileReport
    issued: tuple[str, ...] = ()


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """The allocator part of one heartbeat response.

    Attributes:
        mode: current mode.
        commands: executable commands for the polling host, in service order.
        lease_ttl_s: seconds of mutation authority left, in the server's clock.
    """

    mode: str
    commands: tuple[Command, ...] = ()
    lease_ttl_s: float = 0.0


class _ActionCommon(TypedDict):
    """Fields a proposal's load and warm actions share."""

    host_id: str
    model_id: str
    artifact_sha256: str | None
    generation: str
    reason: str
    priority: int
    service_class: ServiceClass
    created_at: float
    not_before: float
    eviction: bool
    beneficiary: str | None
    runtime: str | None


def build_actions(
    admitted: Iterable[Proposal], generation: str, now: float, next_order: Callable[[], int]
) -> list[Action]:
    """Turn admitted proposals into action records (a cold warm becomes load + warm).

    Every load action, whether it precedes a warm or stands alone, carries the profile's
    ``artifact_source`` and ``artifact_size_mb``: a node refuses to download without them.
    """
    out: list[Action] = []
    for p in admitted:
        common: _ActionCommon = {
            "host_id": p.host_id,
            "model_id": p.model_id,
            "artifact_sha256": p.artifact_sha256,
            "generation": generation,
            "reason": p.reason,
            "priority": p.priority,
            "service_class": p.service_class,
            "created_at": now,
            "not_before": now,
            "eviction": p.eviction,
            "beneficiary": p.beneficiary,
            "runtime": p.runtime,
        }
        deps: list[str] = []
        if p.load_first:
            load = Action(
                action_id=action_id("load", p.host_id, p.model_id, p.artifact_sha256, generation),
                kind="load",
                order=next_order(),
                artifact_source=p.artifact_source,
                artifact_size_mb=p.artifact_size_mb,
                **common,
            )
            out.append(load)
            deps.append(load.action_id)
        out.append(
            Action(
                action_id=action_id(p.kind, p.host_id, p.model_id, p.artifact_sha256, generation),
                kind=p.kind,
                memory_mb=p.memory_mb,
                dependencies=deps,
                order=next_order(),
                # A standalone load (a cache-only predictive fetch, a pre-drain fetch of the
                # beneficiary) needs the source and size a node checks before it downloads.
                artifact_source=p.artifact_source if p.kind == "load" else None,
                artifact_size_mb=p.artifact_size_mb if p.kind == "load" else None,
                ready_timeout_s=p.ready_timeout_s,
                deadline_basis=p.deadline_basis,
                **common,
            )
        )
    return out


def penalise_failures(
    hosts: Iterable[HostSnapshot], book: ActionBook, profiles: Mapping[str, ModelProfile]
) -> list[HostSnapshot]:
    """Snapshots in which recent load/warm failures make that host look slower to start.

    The penalty is bounded (:data:`PENALTY_CAP` failures count), so after backoff a healthy
    peer is tried next while the failed host remains a fallback when it is the only feasible
    target (specification, "Global placement loop": persisted failed attempts).
    """
    extra: dict[tuple[str, str], int] = {}
    for key, rec in book.failures.items():
        kind, host_id, model_id = key.split("\x1f")
        if kind in ("load", "warm") and rec.count > 0:
            k = (host_id, model_id)
            extra[k] = min(PENALTY_CAP, max(extra.get(k, 0), rec.count))
    out = []
    for h in hosts:
        mine = {m: n for (hid, m), n in extra.items() if hid == h.host_id and m in profiles}
        if not mine:
            out.append(h)
            continue
        perf = dict(h.performance)
        for m, n in mine.items():
            cur = perf.get(m) or ModelPerformance()
            base = cur.warm_s if cur.warm_s is not None else profiles[m].warm_estimate_s
            perf[m] = msgspec.structs.replace(cur, warm_s=base + FAILURE_PENALTY_S * n)
        out.append(msgspec.structs.replace(h, performance=perf))
    return out


def with_in_flight(hosts: Iterable[HostSnapshot], book: ActionBook) -> list[HostSnapshot]:
    """Planning snapshots that show the fleet's in-flight mutations, not only its last report.

    A warm that is pending, running or may still be running appears as a ``warming``
    residency, so the planner seeds it as an incumbent instead of re-scoring its replica onto
    another host while the node converges (the old choice would then still finish, leaving a
    surplus replica and cancelled actions that later succeed). A ready replica with an
    eviction drain, a delivered drain or an unload in flight appears as ``draining``: it is
    leaving for good, so it is not kept as a serving incumbent (a peer that is not leaving is
    kept instead) and its host stays the beneficiary's cheapest, sticky target. A routine
    drain not yet delivered leaves the replica ``ready``, so returning demand can keep it and
    cancel the drain. Only the planner's view changes; reconciliation and
    delivery keep judging the reported inventory (specification, "Global placement loop":
    in-progress incumbents are occupied, already-draining victims come first; "Reconciliation
    and modes": a delivered drain may be running; "Safety invariants" 3 and 5).

    Args:
        hosts: reported host snapshots.
        book: the action book (pending/running/delivered-unreceipted actions are in flight).

    Returns:
        One snapshot per host, in input order (unchanged objects where nothing is in flight).
    """
    warming: dict[str, dict[str, Action]] = {}
    leaving: dict[str, set[str]] = {}
    for a in book:
        if not (a.active or a.maybe_running):
            continue
        if a.kind == "warm":
            warming.setdefault(a.host_id, {}).setdefault(a.model_id, a)
        elif a.kind == "unload" or (a.kind == "drain" and (a.eviction or a.delivered)):
            # A routine (obsolete) drain stays visible as ready only while it is undelivered:
            # if the plan wants the replica again, cancelling the drain beats a cold load
            # elsewhere. Once delivered the node may have fenced the route already, and no
            # command takes a drain back, so the replica is leaving like an evicted one.
            leaving.setdefault(a.host_id, set()).add(a.model_id)
    out = []
    for h in hosts:
        warm, gone = warming.get(h.host_id, {}), leaving.get(h.host_id, set())
        if not warm and not gone:
            out.append(h)
            continue
        rows = []
        for r in h.residencies:
            if r.model_id in gone and r.state == "ready" and r.actuatable:
                r = msgspec.structs.replace(r, state="draining", routable=False)
            rows.append(r)
        present = {r.model_id for r in h.residencies if r.state != "cached"}
        for model_id, a in sorted(warm.items()):
            if model_id in present or a.memory_mb <= 0:
                continue  # reported already (or re-warming a failed process that holds memory)
            rows = [r for r in rows if r.model_id != model_id]  # a cached row becomes live
            rows.append(
                ResidencySnapshot(
                    model_id=model_id,
                    memory_mb=a.memory_mb,
                    state="warming",
                    loaded_at=a.created_at,
                    runtime=a.runtime or None,
                    artifact_sha256=a.artifact_sha256,  # the revision the warm will prove
                )
            )
        rows.sort(key=lambda r: r.model_id)
        out.append(msgspec.structs.replace(h, residencies=tuple(rows)))
    return out


def clear_proven_blocks(
    blocks: dict[str, list[str]],
    book: ActionBook,
    hosts: Mapping[str, HostSnapshot],
    now: float,
    policy: GovernorPolicy,
) -> None:
    """Release withdrawn destructive actions whose effect a newer heartbeat proves.

    A block ends only with a terminal receipt (see ``Controller.acknowledge``) or a report,
    newer than the withdrawal, from a reachable host showing the action's postcondition
    (draining/cached/absent). There is deliberately no timeout.
    """
    for model, ids in list(blocks.items()):
        keep = []
        for aid in ids:
            a = book.get(aid)
            if a is None:
                continue  # pruned means it got a receipt long ago
            host = hosts.get(a.host_id)
            proven = False
            if (
                host is not None
                and reachable(host, policy)
                and (observed_at(host, now) > (a.completed_at or 0.0))
            ):
                r = host.residency(a.model_id)
                proven = r is None or r.state in POSTCONDITION.get(a.kind, frozenset())
            if not proven:
                keep.append(aid)
        if keep:
            blocks[model] = keep
        else:
            del blocks[model]
