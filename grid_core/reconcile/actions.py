"""Actions: the small, idempotent side effects that turn a plan into reality.

An action is created once, gets a stable id derived from its identity, and then only moves
forward through its status. The :class:`ActionBook` is the controller's durable record of
every action it has issued: it suppresses pending equivalents, makes duplicate
acknowledgements harmless, lets a late receipt complete a cancelled action, and ignores a
receipt that conflicts with one already recorded (specification, "Safety invariants" 9).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Literal

import msgspec

from grid_core.wire import AckStatus, ActionKind

ActionStatus = Literal[
    "pending",  # issued; waiting for delivery or for its first receipt
    "running",  # the node reported it started
    "succeeded",
    "failed",
    "rejected",  # the node refused it (stale generation, local admission, lower term …)
    "cancelled",  # the controller no longer wants it (mode change, plan change, retirement)
    "withdrawn",  # a destructive action that fresh evidence made unsafe
]
ServiceClass = Literal["baseline", "direct", "predictive", "cleanup"]
"""Scheduling class inside one priority: required baseline, then real demand, then
correlation-only prewarming; routine cleanup (drain/unload of obsolete copies) comes last."""

ACTIVE: frozenset[str] = frozenset({"pending", "running"})
"""Statuses that still occupy a mutation slot."""
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "rejected"})
"""Statuses set by a node receipt; once reached, later receipts are ignored."""
CLOSED: frozenset[str] = frozenset({"cancelled", "withdrawn"})
"""Statuses set by the controller; a late receipt may still complete them."""
CONSTRUCTIVE: frozenset[str] = frozenset({"load", "warm"})
DESTRUCTIVE: frozenset[str] = frozenset({"drain", "unload", "evict"})

MAX_HISTORY = 512
"""Finished actions kept for status, backoff and observation fencing: a few hours of churn
on a 64-host fleet, small enough to persist on every tick."""
ACTION_ID_HEX = 32
"""Hex digits of the SHA-256 kept in an action id (128 bits: collision-free in practice)."""


def action_id(kind: str, host_id: str, model_id: str, sha: str | None, generation: str) -> str:
    """Stable id of one action, derived from its identity.

    Args:
        kind: ``load``, ``warm``, ``drain``, ``unload`` or ``evict``.
        host_id: target host.
        model_id: target model.
        sha: artifact SHA-256 the action is about (``None`` when unpinned).
        generation: plan generation that created the action; a later lifecycle of the same
            (kind, host, model) therefore gets a new id, a retried delivery keeps the old one.

    Returns:
        A 32-hex-digit id.
    """
    raw = "\x1f".join((kind, host_id, model_id, sha or "", generation))
    return hashlib.sha256(raw.encode()).hexdigest()[:ACTION_ID_HEX]


class Action(msgspec.Struct, kw_only=True):
    """One side effect the controller issued, with its whole lifecycle (durable).

    Attributes:
        action_id: stable id (:func:`action_id`).
        kind: what to do.
        host_id / model_id: where and what.
        memory_mb: resident MB a warm will take (0 for other kinds).
        artifact_sha256: exact weights the action concerns, when the profile pins them.
        generation: plan generation at creation.
        dependencies: ids that must succeed first (a warm on its load).
        reason: machine-stable reason (``missing_replica``, ``obsolete``, ``eviction`` …).
        priority: administrator priority it is scheduled at (a preemption drain inherits its
            beneficiary's).
        service_class: see :data:`ServiceClass`.
        order: service order within the tick that created it (delivery keeps this order).
        created_at / not_before: wall-clock seconds.
        status: see :data:`ActionStatus`.
        delivered_at: when delivery was durably marked (``None``: never delivered).
        completed_at: when it reached its current non-active status.
        receipt_at: when a node receipt closed it (``None`` without a receipt).
        late: a receipt completed it after the controller had cancelled or withdrawn it.
        message: last receipt message or cancellation cause.
        eviction: part of a staged preemption.
        beneficiary: the model a preemption makes room for.
        runtime / artifact_source / artifact_size_mb: passed through to the node.
        duration_s: duration the node reported (seconds).
        artifact_fetched: a load that really downloaded weights.
        ready_timeout_s: warm only: seconds the node waits for readiness before it stops the
            engine as failed, from the profile and learned timings.
        deadline_basis: what set ``ready_timeout_s`` (``floor``, ``profile``, ``learned``).
    """

    action_id: str
    kind: ActionKind
    host_id: str
    model_id: str
    memory_mb: int = 0
    artifact_sha256: str | None = None
    generation: str = ""
    dependencies: list[str] = []
    reason: str = ""
    priority: int = 0
    service_class: ServiceClass = "direct"
    order: int = 0
    created_at: float = 0.0
    not_before: float = 0.0
    status: ActionStatus = "pending"
    delivered_at: float | None = None
    completed_at: float | None = None
    receipt_at: float | None = None
    late: bool = False
    message: str = ""
    eviction: bool = False
    beneficiary: str | None = None
    runtime: str | None = None
    artifact_source: str | None = None
    artifact_size_mb: int | None = None
    duration_s: float | None = None
    artifact_fetched: bool = False
    ready_timeout_s: float | None = None
    deadline_basis: str | None = None

    @property
    def active(self) -> bool:
        """Still occupying a slot (pending or running)."""
        return self.status in ACTIVE

    @property
    def delivered(self) -> bool:
        """Delivery was durably marked at least once."""
        return self.delivered_at is not None

    @property
    def destructive(self) -> bool:
        """Drain, unload or evict."""
        return self.kind in DESTRUCTIVE

    @property
    def maybe_running(self) -> bool:
        """The node may be executing it: delivered and no receipt has closed it yet."""
        return self.delivered and self.receipt_at is None and self.status not in TERMINAL


AckOutcome = Literal["applied", "late", "duplicate", "conflict", "unknown", "wrong_host"]


class FailureRecord(msgspec.Struct, kw_only=True):
    """Consecutive failures of one (kind, host, model), for exponential backoff (durable)."""

    count: int = 0
    last_at: float = 0.0


class ActionBook:
    """The controller's record of issued actions, indexed for O(1) lookups per tick.

    Finished actions are kept in a bounded history (:data:`MAX_HISTORY`); active ones are
    never dropped.
    """

    def __init__(
        self, actions: Iterable[Action] = (), failures: dict[str, FailureRecord] | None = None
    ) -> None:
        self._by_id: dict[str, Action] = {}
        self.failures: dict[str, FailureRecord] = dict(failures or {})
        for a in actions:
            self._by_id[a.action_id] = a
        self._order = max((a.order for a in self._by_id.values()), default=0)

    def next_order(self) -> int:
        """The next issue order number (monotonic across restarts of this book)."""
        self._order += 1
        return self._order

    # --- queries ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Action]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, action_id: str) -> Action | None:
        """The action with this id, if the book still holds it."""
        return self._by_id.get(action_id)

    def active(self) -> list[Action]:
        """Pending and running actions, in service order."""
        return sorted(
            (a for a in self._by_id.values() if a.active), key=lambda a: (a.created_at, a.order)
        )

    def index_active(self) -> dict[tuple[str, str, str], Action]:
        """(kind, host, model) → its active action (at most one by construction)."""
        return {(a.kind, a.host_id, a.model_id): a for a in self._by_id.values() if a.active}

    def last_finished(self) -> dict[tuple[str, str, str], Action]:
        """(kind, host, model) → the most recently finished action of that identity."""
        out: dict[tuple[str, str, str], Action] = {}
        for a in self._by_id.values():
            if a.active or a.completed_at is None:
                continue
            key = (a.kind, a.host_id, a.model_id)
            prev = out.get(key)
            if prev is None or (prev.completed_at or 0.0) <= a.completed_at:
                out[key] = a
        return out

    # --- changes ------------------------------------------------------------------------
    def add(self, action: Action) -> bool:
        """Record a new action unless an active equivalent exists.

        Returns:
            False when an active action of the same (kind, host, model) or the same id is
            already recorded (the pending equivalent suppresses the new one).
        """
        if action.action_id in self._by_id:
            return False
        for a in self._by_id.values():
            if a.active and (a.kind, a.host_id, a.model_id) == (
                action.kind,
                action.host_id,
                action.model_id,
            ):
                return False
        self._by_id[action.action_id] = action
        return True

    def close(
        self, action: Action, status: Literal["cancelled", "withdrawn"], now: float, message: str
    ) -> None:
        """The controller gives up on an active action (a late receipt may still complete it)."""
        if not action.active:
            return
        action.status = status
        action.completed_at = now
        action.message = message

    def acknowledge(
        self,
        host_id: str,
        action_id: str,
        status: AckStatus,
        now: float,
        message: str = "",
        duration_s: float | None = None,
        artifact_fetched: bool = False,
    ) -> AckOutcome:
        """Apply one node receipt.

        Args:
            host_id: host the receipt came from (must be the action's host).
            action_id: the action.
            status: ``running``, ``succeeded``, ``failed`` or ``rejected``.
            now: receipt time (wall-clock seconds).
            message / duration_s / artifact_fetched: passed through from the node.

        Returns:
            ``applied`` (state moved), ``late`` (completed a cancelled or withdrawn action),
            ``duplicate`` (same status again: harmless), ``conflict`` (contradicts a recorded
            receipt: ignored), ``unknown`` (no such action) or ``wrong_host``.
        """
        a = self._by_id.get(action_id)
        if a is None:
            return "unknown"
        if a.host_id != host_id:
            return "wrong_host"
        if a.status in TERMINAL:
            return "duplicate" if a.status == status else "conflict"
        if status == "running":
            if a.status == "running":
                return "duplicate"
            if a.status == "pending":
                a.status = "running"
                return "applied"
            return "duplicate"  # a cancelled action that started stays cancelled until done
        was_closed = a.status in CLOSED
        a.status = status
        a.completed_at = now
        a.receipt_at = now
        a.late = was_closed
        a.message = message
        if duration_s is not None:
            a.duration_s = duration_s
        a.artifact_fetched = artifact_fetched and a.kind == "load"
        key = failure_key(a.kind, a.host_id, a.model_id)
        if status == "succeeded":
            self.failures.pop(key, None)
        else:
            rec = self.failures.setdefault(key, FailureRecord())
            rec.count += 1
            rec.last_at = now
        return "late" if was_closed else "applied"

    def prune(self) -> None:
        """Drop the oldest finished actions beyond :data:`MAX_HISTORY` (active ones stay)."""
        finished = [a for a in self._by_id.values() if not a.active]
        excess = len(finished) - MAX_HISTORY
        if excess <= 0:
            return
        finished.sort(key=lambda a: (a.completed_at or 0.0, a.created_at))
        for a in finished[:excess]:
            # A delivered action without a receipt may still be running on its node; keep it
            # so a late receipt can complete it and so the memory it may hold stays counted.
            if a.maybe_running:
                continue
            del self._by_id[a.action_id]


def failure_key(kind: str, host_id: str, model_id: str) -> str:
    """Key of the backoff table: failures are tracked per action kind, host and model."""
    return f"{kind}\x1f{host_id}\x1f{model_id}"
