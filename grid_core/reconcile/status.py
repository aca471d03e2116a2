"""Status values: everything the controller decided, as JSON-encodable msgspec Structs.

Specification, "HTTP control surface" (``GET /allocator/status``): mode, hosts, profiles,
forecasts, the latest plan and reconciliation, revisions, pending and withdrawn commands,
unmet constraints, the persistent-state warning and bounded action history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from grid_core.planner.types import Plan, Unmet
from grid_core.profile import ModelProfile
from grid_core.reconcile.actions import Action
from grid_core.reconcile.quality import QualityView
from grid_core.reconcile.reconciler import Deferred, Proposal, Withdrawal
from grid_core.reconcile.timings import TimingView
from grid_core.snapshot import ResidencySnapshot
from grid_core.wire import Mode

if TYPE_CHECKING:  # the controller is only read here; importing it would be circular
    from grid_core.controller import Controller

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
        )


class HostView(msgspec.Struct, frozen=True, kw_only=True):
    """One host's lifecycle and memory as the controller last saw it (MB, seconds)."""

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
    residencies: list[ResidencySnapshot] = []


class Revisions(msgspec.Struct, frozen=True, kw_only=True):
    """Causal counters: ``dirty`` advances on every input, ``safety`` only on changes that
    matter to destructive safety; ``processed``/``success`` are the dirty revision the last
    (successful) tick started from, ``tick_safety`` the safety revision it saw."""

    dirty: int
    processed: int
    success: int
    safety: int
    tick_safety: int


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


def controller_status(ctl: Controller, now: float, detail: bool) -> ControllerStatus:
    """Assemble the controller's status value (what ``GET /allocator/status`` shows).

    Args:
        ctl: the controller to describe (read only).
        now: wall-clock seconds (ages, grace deadline).
        detail: include host residencies, the full plan, timings and the longer history.
    """
    from grid_core.reconcile.control import host_views  # control imports this module

    active = ctl.book.active()
    finished = sorted(
        (a for a in ctl.book if not a.active),
        key=lambda a: a.completed_at or 0.0,
        reverse=True,
    )
    blocked_ids = {i for ids in ctl.blocks.values() for i in ids}
    grace = None
    if ctl._restored and ctl._grace_anchor is not None:
        grace = ctl._grace_anchor + ctl.policy.governor.restart_grace_s
    return ControllerStatus(
        mode=ctl.mode,
        controller_id=ctl.controller_id,
        controller_term=ctl.term,
        controller_lease_expires_at=ctl.lease_expires_at,
        authority=ctl.authority,
        automatic_refusal=ctl.automatic_refusal,
        generation=ctl.generation,
        profiles=[ctl.profiles[k] for k in sorted(ctl.profiles)],
        retired=dict(ctl.tombstones),
        forecasts=msgspec.to_builtins(ctl.last_forecasts),
        hosts=host_views(ctl.last_hosts, ctl.book, now, ctl.policy.governor, detail),
        plan=ctl.last_plan if detail else None,
        reconciliation=ctl.last_report,
        pending_commands=[ActionView.of(a) for a in active],
        delivered_pending=[a.action_id for a in active if a.delivered],
        withdrawn_destructive=[ActionView.of(a) for a in ctl.book if a.action_id in blocked_ids],
        blocked_models={m: list(v) for m, v in ctl.blocks.items()},
        unmet=list(ctl.last_plan.unmet) if ctl.last_plan else [],
        revisions=Revisions(
            dirty=ctl.dirty_revision,
            processed=ctl.processed_revision,
            success=ctl.success_revision,
            safety=ctl.safety_revision,
            tick_safety=ctl.tick_safety_revision,
        ),
        last_tick_at=ctl.last_tick_at,
        last_tick_duration_ms=ctl.last_tick_duration_ms,
        state_warning=ctl.state_warning,
        warnings=list(ctl.warnings[-16:]),
        restart_grace_until=grace,
        history=[ActionView.of(a) for a in finished[: STATUS_HISTORY if detail else 8]],
        quality=ctl.quality.views(ctl.profiles, now),
        timings=[TimingView.of(e, now) for e in ctl.timings.entries()] if detail else [],
    )
