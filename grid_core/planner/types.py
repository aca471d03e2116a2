"""The planner's output: a plan is a value that status can show whole."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from grid_core.demand.prefetch import PREDICTIVE_FLOOR_MB as PREDICTIVE_FLOOR_MB
from grid_core.demand.types import ModelDemand
from grid_core.eligibility import FUTURE_SKEW_S as FUTURE_SKEW_S
from grid_core.eligibility import STALE_HEARTBEAT_S as STALE_HEARTBEAT_S
from grid_core.headroom import ADMISSION_HEADROOM_FRACTION as ADMISSION_HEADROOM_FRACTION
from grid_core.headroom import ADMISSION_HEADROOM_MB as ADMISSION_HEADROOM_MB
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

THROTTLED_FRACTION = 0.5
"""Share of capacity a throttled host offers for new placement unless it reports a smaller one."""
MAX_EVICTIONS = 64
"""Evictions staged per plan; larger changes converge over later heartbeats."""
REPAIR_BUDGET = 400
"""Backtracking repair steps per plan: enough to unfragment a few replicas, never seconds."""

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
    "shortfall_settling",
    "relocation_staged",
    "host_shortage",
]

UnmetResource = Literal[
    "memory",
    "slots",
    "disk",
    "colocation",
    "runtime",
    "tags",
    "tier",
    "gpu",
    "eligibility",
    "domain",
    "pin",
]
"""The resource that binds a shortfall: what an operator would add or relax."""


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
    make_before_break: bool = False
    """The victim is the last ready replica of a model with a baseline and this plan also
    places (or stages) its replacement elsewhere: reconciliation drains it only once that
    replacement is ready, so the model never has zero ready replicas
    (:func:`grid_core.planner.relocation.mark_make_before_break`)."""


class SurplusReplica(msgspec.Struct, frozen=True, kw_only=True):
    """A replica of a model that holds more replicas than its current demand needs, and what
    the plan did with it (status shows why a surplus replica was reclaimed or kept).

    Attributes:
        model_id / host_id: the replica.
        decision: ``reclaimed`` (staged for drain so another model's direct demand gets the
            host) or ``kept``.
        reason: for ``reclaimed`` the beneficiary's need (``direct_demand``); for ``kept`` why
            it was not taken: ``no_claimant`` (no model with preemption authority needs its
            host), ``min_residency``, ``in_flight``, ``activity_unknown``, ``pinned``,
            ``last_ready_replica``, or ``needed`` (after the reclaims of this plan the model
            needs every replica it has left).
        beneficiary: the model that gets the host (``reclaimed`` only).
        needed: replicas the model's current demand needs (the rest is hysteresis).
    """

    model_id: str
    host_id: str
    decision: Literal["kept", "reclaimed"]
    reason: str
    beneficiary: str | None = None
    needed: int = 0


class Unmet(msgspec.Struct, frozen=True, kw_only=True):
    """A shortfall the plan could not satisfy; never hidden, never overcommitted.

    Attributes:
        code: machine-stable kind of shortfall.
        model_id: the model that is short.
        resource: the binding resource; for a staged preemption or relocation, what it
            frees on its host (memory, slots, colocation). ``None`` only in plans from
            versions that named none for staged changes.
        message: one line naming the model, the numbers and the fix.
        host_id: the host concerned (pins, staged relocations).
        missing: replicas (or failure domains) missing.
    """

    code: UnmetCode
    model_id: str
    resource: UnmetResource | None = None
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
        surplus: replicas of models holding more than current demand needs (kept only for
            hysteresis), each reclaimed or kept with the reason.
    """

    assignments: tuple[Assignment, ...]
    desired: dict[str, int]
    evictions: tuple[Eviction, ...] = ()
    unmet: tuple[Unmet, ...] = ()
    digest: str = ""
    surplus: tuple[SurplusReplica, ...] = ()

    def hosts_of(self, model_id: str) -> tuple[str, ...]:
        """Hosts assigned to ``model_id``, in plan order."""
        return tuple(a.host_id for a in self.assignments if a.model_id == model_id)


class PlannerPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Planner tunables (seconds, MB, fractions); defaults are the module constants.

    Attributes:
        stale_heartbeat_s: heartbeat age beyond which a host receives nothing new.
        future_skew_s: tolerated future-dated heartbeat (negative age) before it is implausible.
        admission_headroom_mb: floor of the free MB a new or resized allocation must leave.
        admission_headroom_fraction: share of a new replica's resident MB it must leave free
            when that exceeds the floor (see :func:`grid_core.headroom.admission_headroom_mb`).
        throttled_fraction: capacity share a throttled host offers for new placement.
        max_evictions: staged evictions per plan.
        repair_budget: backtracking repair steps per plan.
        predictive_floor_mb: free disk (MB) a cache-only predictive transfer must leave on
            its host, by the host's authenticated report (specification: 10 GiB by default,
            operators tune or disable it; 0 disables). Demanded loads never use it.
    """

    stale_heartbeat_s: float = STALE_HEARTBEAT_S
    future_skew_s: float = FUTURE_SKEW_S
    admission_headroom_mb: int = ADMISSION_HEADROOM_MB
    admission_headroom_fraction: float = ADMISSION_HEADROOM_FRACTION
    throttled_fraction: float = THROTTLED_FRACTION
    max_evictions: int = MAX_EVICTIONS
    repair_budget: int = REPAIR_BUDGET
    predictive_floor_mb: Annotated[int, msgspec.Meta(ge=0)] = PREDICTIVE_FLOOR_MB


class PlanInputs(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one plan depends on; the plan digest hashes exactly this.

    Attributes:
        now: planning instant (Unix seconds, server clock).
        profiles: configured models (any order; the planner sorts).
        hosts: host snapshots (any order; the planner sorts).
        demand: model id → forecast demand; a model without an entry wants its baseline.
        policy: planner tunables.
    """

    now: float
    profiles: tuple[ModelProfile, ...]
    hosts: tuple[HostSnapshot, ...]
    demand: dict[str, ModelDemand] = {}
    policy: PlannerPolicy = PlannerPolicy()
