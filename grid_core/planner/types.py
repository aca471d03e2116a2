"""The planner's output: a plan is a value that status can show whole."""

from __future__ import annotations

from typing import Literal

import msgspec

UnmetCode = Literal[
    "capacity_shortage",
    "failure_domain_shortfall",
    "pin_unavailable",
    "no_eligible_host",
    "colocation_conflict",
    "preemption_staged",
    "disk_shortage",
    "slot_limit",
    "eviction_budget",
]


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    """One desired replica of ``model_id`` on ``host_id``.

    Attributes:
        incumbent: the replica already exists there (kept, not newly placed).
        runtime: runtime chosen for a new placement (smallest declared footprint).
        memory_mb: resident MB this replica accounts for on the host.
        reason: short machine-stable reason (``incumbent``, ``pin``, ``score``, ``repair`` …).
        score: the summed placement score when chosen by scoring.
    """

    model_id: str
    host_id: str
    incumbent: bool
    runtime: str
    memory_mb: int
    reason: str
    score: float | None = None


class Eviction(msgspec.Struct, frozen=True, kw_only=True):
    """A staged preemption: drain then unload ``model_id`` on ``host_id``.

    The beneficiary stays unsatisfied until a later snapshot proves the memory is free.
    """

    model_id: str
    host_id: str
    beneficiary: str | None
    priority: int
    """Priority the drain inherits (its beneficiary's)."""
    reason: str


class Unmet(msgspec.Struct, frozen=True, kw_only=True):
    """A shortfall the plan could not satisfy; never hidden, never overcommitted."""

    code: UnmetCode
    model_id: str
    message: str
    host_id: str | None = None
    missing: int = 0


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """The complete desired placement for one tick.

    Attributes:
        assignments: every desired replica (incumbents kept included), deterministic order.
        desired: model id → desired replica count (after min/max clamping).
        evictions: staged preemptions (at most the per-plan eviction budget).
        unmet: constraint shortfalls with a code and a message.
        digest: SHA-256 of the canonical encoding of the complete inputs.
    """

    assignments: tuple[Assignment, ...]
    desired: dict[str, int]
    evictions: tuple[Eviction, ...] = ()
    unmet: tuple[Unmet, ...] = ()
    digest: str = ""

    def hosts_of(self, model_id: str) -> tuple[str, ...]:
        """Hosts assigned to ``model_id``, in plan order."""
        return tuple(a.host_id for a in self.assignments if a.model_id == model_id)
