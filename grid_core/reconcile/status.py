"""Status values: everything the controller decided, as JSON-encodable msgspec Structs.

Specification, "HTTP control surface" (``GET /allocator/status``): mode, hosts, profiles,
forecasts, the latest plan and reconciliation, revisions, pending and withdrawn commands,
unmet constraints, the persistent-state warning and bounded action history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from grid_core.demand.inference import InferredDemand
from grid_core.demand.prefetch import PrefetchDecision
from grid_core.demand.types import ModelDemand
from grid_core.planner.types import Plan, Unmet
from grid_core.portfolio.types import PortfolioReport
from grid_core.profile import ModelProfile
from grid_core.reconcile.actions import Action, ActionBook
from grid_core.reconcile.authority import Authority
from grid_core.reconcile.holds import Holds
from grid_core.reconcile.policy import GovernorPolicy
from grid_core.reconcile.quality import QualityBook, QualityView
from grid_core.reconcile.reconciler import Deferred, Proposal, Withdrawal
from grid_core.reconcile.revisions import Revisions
from grid_core.reconcile.state import DurableState
from grid_core.reconcile.timings import TimingBook, TimingView
from grid_core.reconcile.view import admitting, reachable, reserved_by_actions, used_mb
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.wire import Mode

STATUS_HISTORY = 64
"""Finished actions shown in status: the recent past, not the whole durable history."""


class ActionView(msgspec.Struct, frozen=True, kw_only=True):
    """One action as status shows it."""

    action_id: str
    kind: str
    host_id: str
    model_id: str
    status: str
    reason: str
    priority: int
    service_class: str
    generation: str
    created_at: float
    not_before: float
    dependencies: list[str] = []
    delivered_at: float | None = None
    completed_at: float | None = None
    late: bool = False
    message: str = ""
    eviction: bool = False
    beneficiary: str | None = None
    ready_timeout_s: float | None = None
    """Warm only: the readiness deadline the node was given (seconds)."""
    deadline_basis: str | None = None
    """Warm only: what set it: ``floor``, ``profile`` (warm estimate) or ``learned``."""

    @classmethod
    def of(cls, a: Action) -> ActionView:
        """The view of an action record."""
        return cls(
            action_id=a.action_id,
            kind=a.kind,
            host_id=a.host_id,
            model_id=a.model_id,
            status=a.status,
            reason=a.reason,
            priority=a.priority,
            service_class=a.service_class,
            generation=a.generation,
            created_at=a.created_at,
            not_before=a.not_before,
            dependencies=list(a.dependencies),
            delivered_at=a.delivered_at,
            completed_at=a.completed_at,
            late=a.late,
            message=a.message,
            eviction=a.eviction,
            beneficiary=a.beneficiary,
            ready_timeout_s=a.ready_timeout_s,
            deadline_basis=a.deadline_basis,
        )


class CachedView(msgspec.Struct, frozen=True, kw_only=True):
    """One artifact a host reported verified on its disk (no memory, no model slot).

    Attributes:
        model_id: the model the weights belong to.
        artifact_sha256: their exact SHA-256, ``None`` when the host did not say.
        predictive: the node downloaded them for a cache-only predictive prefetch and no
            replica has started from them since (the only cache the predictive lifecycle may
            expire or replace; specification, "Proactive observation and portfolio planning").
        cached_at: for a predictive entry, when its verified download finished (server-clock
            Unix seconds); ``None`` otherwise.
    """

    model_id: str
    artifact_sha256: str | None = None
    predictive: bool = False
    cached_at: float | None = None


def cached_views(h: HostSnapshot) -> list[CachedView]:
    """The host's cached artifacts by model id, each with its predictive provenance."""
    return [
        CachedView(
            model_id=m,
            artifact_sha256=sha,
            predictive=m in h.predictive_cached,
            cached_at=h.predictive_cached.get(m),
        )
        for m, sha in sorted(h.cached.items())
    ]


class HostView(msgspec.Struct, frozen=True, kw_only=True):
    """One host's lifecycle and memory as the controller last saw it (MB, seconds).

    ``runtimes`` are the engine families the host offers (its installed runtime plugins, or
    the ``--kind`` of a joined engine), ``backends`` the compute backends it reported
    (``cpu``, ``metal``, ``cuda``…), ``gpu_count``/``gpu_memory_mb`` its GPU facts (the
    smallest device's memory). Whether Grid owns an engine is per residency
    (``ownership``: only ``managed`` ones are ever commanded). ``cached`` lists the weights
    on its disk and which of them a predictive prefetch put there (always shown: bounded by
    the heartbeat's list limit).
    """

    host_id: str
    state: str
    healthy: bool
    reachable: bool
    admitting: bool
    heartbeat_age_s: float | None
    capacity_mb: int
    reserved_mb: int
    allocatable_mb: int
    used_mb: int
    free_mb: int
    failure_domain: str | None = None
    runtimes: list[str] = []
    backends: list[str] = []
    gpu_count: int = 0
    gpu_memory_mb: int = 0
    residencies: list[ResidencySnapshot] = []
    cached: list[CachedView] = []


class ReconcileReport(msgspec.Struct, frozen=True, kw_only=True):
    """The reconciliation result of the latest tick.

    Attributes:
        generation: plan generation it reconciled.
        mode: mode at that tick.
        proposals: wanted actions in service order (recommend: the recommendation).
        deferred: postponed work with reasons (observe: all drift).
        withdrawals: active actions closed this tick.
        issued: ids of actions created this tick (automatic only).
        hold: fleet-wide hold in force (``restart_grace``, ``membership_hiccup``), if any.
        ready: model id → READY replicas on admitting hosts.
    """

    generation: str
    mode: Mode
    proposals: list[Proposal] = []
    deferred: list[Deferred] = []
    withdrawals: list[Withdrawal] = []
    issued: list[str] = []
    hold: str | None = None
    ready: dict[str, int] = {}


class ControllerStatus(msgspec.Struct, kw_only=True):
    """Everything ``GET /allocator/status`` shows (JSON-encodable)."""

    mode: Mode
    controller_id: str
    controller_term: int
    controller_lease_expires_at: float
    authority: str
    """``held``, ``none`` (not automatic) or ``lost: <cause>``."""
    automatic_refusal: str | None
    generation: str
    profiles: list[ModelProfile]
    retired: dict[str, float]
    forecasts: dict[str, Any]
    hosts: list[HostView]
    plan: Plan | None
    reconciliation: ReconcileReport | None
    pending_commands: list[ActionView]
    delivered_pending: list[str]
    withdrawn_destructive: list[ActionView]
    blocked_models: dict[str, list[str]]
    unmet: list[Unmet]
    revisions: Revisions
    last_tick_at: float | None
    last_tick_duration_ms: float | None
    state_warning: str | None
    warnings: list[str]
    restart_grace_until: float | None
    history: list[ActionView]
    quality: list[QualityView] = []
    """Labelled quality evidence of each configured model's current artifact revision."""
    timings: list[TimingView] = []
    """Learned lifecycle durations by host, model, artifact revision and phase."""
    portfolio: PortfolioReport | None = None
    """Unbound workload demand: the joint mapping, the exploration slot, the admission gate,
    candidate rows (feasibility and evidence) and one admission row per active workload."""
    predictions: list[InferredDemand] = []
    """Inferred demand the plan used: each row names its learned edge (``source→target``),
    kind (``sequence``, ``group``, ``pair``), confidence, support and rate."""
    prefetch: PrefetchDecision | None = None
    """Cache-only predictive advisories (fetch, TTL and replacement evictions) and the
    predictions that got none, with the reason."""
    delivery_refusals: list[str] = []
    """The latest destructive commands the final delivery check held back
    (``action_id: reason``), newest last; bounded by :data:`MAX_DELIVERY_REFUSALS`."""


MAX_DELIVERY_REFUSALS = 16
"""Delivery-check refusals kept for status: enough to see a pattern, bounded in memory."""


class LastTick:
    """What the latest tick saw and decided (status shows it; nothing here is durable).

    Attributes:
        plan: the plan, once a tick ran.
        report: its reconciliation report.
        forecasts: model id → the demand forecast the plan used.
        hosts: host id → the snapshot the tick used (learned timings applied).
        at: wall-clock seconds the tick ran.
        duration_ms: how long the caller measured it to take (milliseconds).
        portfolio: the portfolio pass's report with its admission rows.
        predictions: inferred demand rows (learned workflows, co-activation) the plan used.
        homes: model → hosts an unserved prediction would start on if its request came now
            (where a cache-only transfer may go).
        delivery_refusals: destructive commands the final delivery check held back, as
            ``action_id: reason`` (the latest :data:`MAX_DELIVERY_REFUSALS`).
    """

    def __init__(self) -> None:
        self.delivery_refusals: list[str] = []
        self.plan: Plan | None = None
        self.report: ReconcileReport | None = None
        self.forecasts: dict[str, ModelDemand] = {}
        self.hosts: dict[str, HostSnapshot] = {}
        self.at: float | None = None
        self.duration_ms: float | None = None
        self.portfolio: PortfolioReport | None = None
        self.predictions: list[InferredDemand] = []
        self.homes: dict[str, frozenset[str]] = {}
        self.prefetch = PrefetchDecision()


@dataclass(frozen=True)
class ControllerRecords:
    """The records status describes: profiles, retirements, actions, blocks and evidence.

    Attributes:
        profiles: configured profiles by model id.
        tombstones: retired model id → retirement time (wall-clock seconds).
        book: issued actions and their history.
        blocks: model id → withdrawn delivered destructive action ids awaiting proof.
        quality: labelled quality evidence.
        timings: learned lifecycle durations.
    """

    profiles: Mapping[str, ModelProfile]
    tombstones: Mapping[str, float]
    book: ActionBook
    blocks: Mapping[str, list[str]]
    quality: QualityBook
    timings: TimingBook


def host_views(
    hosts: Mapping[str, HostSnapshot],
    book: ActionBook,
    now: float,
    policy: GovernorPolicy,
    detail: bool,
) -> list[HostView]:
    """Status rows for the hosts of the last tick (residencies only with ``detail``)."""
    actions = list(book)
    out = []
    for hid in sorted(hosts):
        h = hosts[hid]
        used = used_mb(h)
        out.append(
            HostView(
                host_id=hid,
                state=h.state,
                healthy=h.healthy,
                reachable=reachable(h, policy),
                admitting=admitting(h, policy),
                heartbeat_age_s=h.heartbeat_age_s,
                capacity_mb=h.capacity_mb,
                reserved_mb=h.reserved_mb,
                allocatable_mb=h.allocatable_mb,
                used_mb=used,
                free_mb=h.allocatable_mb - used - reserved_by_actions(h, actions, now),
                failure_domain=h.failure_domain,
                runtimes=sorted(h.runtimes),
                backends=sorted(h.backends),
                gpu_count=h.gpu_count,
                gpu_memory_mb=h.gpu_memory_mb,
                residencies=list(h.residencies) if detail else [],
                cached=cached_views(h),
            )
        )
    return out


def controller_status(
    *,
    authority: Authority,
    document: DurableState,
    revisions: Revisions,
    holds: Holds,
    generation: str,
    records: ControllerRecords,
    last: LastTick,
    warnings: list[str],
    policy: GovernorPolicy,
    now: float,
    detail: bool,
) -> ControllerStatus:
    """Assemble the controller's status value (what ``GET /allocator/status`` shows).

    Every argument is read only.

    Args:
        authority: mode, lease and term.
        document: the durable document (its warning).
        revisions: causal counters (a copy is shown).
        holds: restart grace and hiccup tracking.
        generation: the current plan generation.
        records: profiles, retirements, actions, blocks and evidence.
        last: what the latest tick saw and decided.
        warnings: the controller's warnings (the latest 16 are shown).
        policy: governor tunables (reachability and admission of hosts).
        now: wall-clock seconds (ages, free memory of reserved actions).
        detail: include host residencies, the full plan, timings and the longer history.
    """
    book = records.book
    active = book.active()
    finished = sorted(
        (a for a in book if not a.active),
        key=lambda a: a.completed_at or 0.0,
        reverse=True,
    )
    blocked_ids = {i for ids in records.blocks.values() for i in ids}
    return ControllerStatus(
        mode=authority.mode,
        controller_id=authority.controller_id,
        controller_term=authority.term,
        controller_lease_expires_at=authority.lease_expires_at,
        authority=authority.state,
        automatic_refusal=authority.refusal,
        generation=generation,
        profiles=[records.profiles[k] for k in sorted(records.profiles)],
        retired=dict(records.tombstones),
        forecasts=msgspec.to_builtins(last.forecasts),
        hosts=host_views(last.hosts, book, now, policy, detail),
        plan=last.plan if detail else None,
        reconciliation=last.report,
        pending_commands=[ActionView.of(a) for a in active],
        delivered_pending=[a.action_id for a in active if a.delivered],
        withdrawn_destructive=[ActionView.of(a) for a in book if a.action_id in blocked_ids],
        blocked_models={m: list(v) for m, v in records.blocks.items()},
        unmet=list(last.plan.unmet) if last.plan else [],
        revisions=revisions.copy(),
        last_tick_at=last.at,
        last_tick_duration_ms=last.duration_ms,
        state_warning=document.warning,
        warnings=list(warnings[-16:]),
        restart_grace_until=holds.grace_until(),
        history=[ActionView.of(a) for a in finished[: STATUS_HISTORY if detail else 8]],
        quality=records.quality.views(records.profiles, now),
        timings=[TimingView.of(e, now) for e in records.timings.entries()] if detail else [],
        portfolio=last.portfolio,
        predictions=list(last.predictions),
        prefetch=last.prefetch,
        delivery_refusals=list(last.delivery_refusals),
    )
