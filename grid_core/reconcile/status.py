"""Status values: everything the controller decided, as JSON-encodable msgspec Structs.

Specification, "HTTP control surface" (``GET /allocator/status``): mode, hosts, profiles,
forecasts, the latest plan and reconciliation, revisions, pending and withdrawn commands,
unmet constraints, the persistent-state warning and bounded action history.
"""

from __future__ import annotations

from typing import Any

import msgspec

from grid_core.planner.types import Plan, Unmet
from grid_core.profile import ModelProfile
from grid_core.reconcile.actions import Action
from grid_core.reconcile.quality import QualityView
from grid_core.reconcile.reconciler import Deferred, Proposal, Withdrawal
from grid_core.reconcile.timings import TimingView
from grid_core.snapshot import ResidencySnapshot
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
