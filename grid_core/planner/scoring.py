"""Score terms: the soft half of placement, contributed by plugins.

A term is any object with ``name`` (str), ``score(model, host, ctx) -> float`` (larger is
better) and optionally ``dynamic`` (bool, default ``True``). The planner collects terms once
per plan through :meth:`grid_core.plugins.Plugins.score_terms` and sums them.

Memoisation contract (specification, "Reconciliation and modes": planning memoizes
compatibility, fit and the exact dynamic score of a node/model/remaining-capacity/domain state
within one tick): a term's result may depend only on the profile, the host's *facts* and the
fields of :class:`ScoreContext` — never on host identity. Hosts identical apart from
``host_id``, ``heartbeat_age_s`` and ``failure_domain`` form one class, and the term sees the
class's first host (the failure domain reaches terms only as ``ctx.domain_new``). A term with
``dynamic = False`` promises it ignores ``free_mb`` and ``domain_new`` too, so it is evaluated
once per model/host class; dynamic terms once per model/class/free-memory/domain state.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from grid_core.demand.types import ModelDemand
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

MAX_SPEED_WEIGHT = 8.0
"""Measured speed may matter at most 8x more under hot demand than for a light workload."""


class ScoreContext(msgspec.Struct, frozen=True):
    """What a score term may read besides the profile and the host (immutable).

    A frozen struct rather than a frozen dataclass: the planner builds one for every new
    free-memory/domain state it scores (about 3,000 per plan on the 64x32 bench fleets), and
    a struct is built about ten times faster (0.07 µs against 0.8 µs here).

    Attributes:
        now: planning instant (Unix seconds).
        demand: the model's demand (``None`` when it has none).
        memory_mb: MB one replica of the model needs on this host.
        allocatable_mb: raw allocatable MB of the host (after reserve and derating).
        free_mb: MB free for new work on the host before this replica (incremental ledger).
        domain_new: the host's failure domain holds no replica of this model yet.
        speed_weight: 1..8, how much measured speed matters (grows with offered concurrency
            beyond one replica's target capacity).
        cached: exact weights are already on the host's disk.
        resident: the model's residency on the host, if any.
        startup_s: expected load+warm time of a replica on this host (seconds).

    Scarcity (how much still-unplaced demand needs the host) is not a term: the planner
    prices it itself on top of the summed terms (:meth:`PlanState.score`), because it
    changes with every placement while term results are memoised.
    """

    now: float
    demand: ModelDemand | None
    memory_mb: int
    allocatable_mb: int
    free_mb: int
    domain_new: bool
    speed_weight: float
    cached: bool
    resident: ResidencySnapshot | None
    startup_s: float


@runtime_checkable
class ScoreTerm(Protocol):
    """One soft placement preference (``grid_placement_score_terms``); the planner sums terms.

    Attributes:
        name: unique term name (``"best_fit"``); a third-party term with a built-in's name
            replaces the built-in one.

    A term may also set ``dynamic = False`` (a class attribute, default ``True``) to promise
    that it ignores ``ctx.free_mb`` and ``ctx.domain_new``, so the planner evaluates it once per
    model and host class (see the module docstring for the memoisation contract).
    """

    name: str

    def score(self, model: ModelProfile, host: HostSnapshot, ctx: ScoreContext) -> float:
        """Score of one new replica of ``model`` on ``host``; larger is better (unitless).

        Args:
            model: the model's profile.
            host: the host's snapshot (its facts; identity is not meaningful, see above).
            ctx: what else the term may read (:class:`ScoreContext`).
        """
        ...


def speed_weight(demand: ModelDemand | None, per_replica: float) -> float:
    """1 for light demand, rising with offered concurrency per replica capacity, at most 8."""
    if demand is None or per_replica <= 0:
        return 1.0
    return max(1.0, min(MAX_SPEED_WEIGHT, demand.offered_concurrency / per_replica))


def split_terms(terms: list[ScoreTerm]) -> tuple[list[ScoreTerm], list[ScoreTerm]]:
    """(static terms, dynamic terms); a term without ``dynamic`` counts as dynamic."""
    static = [t for t in terms if getattr(t, "dynamic", True) is False]
    dynamic = [t for t in terms if getattr(t, "dynamic", True) is not False]
    return static, dynamic
