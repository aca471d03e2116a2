"""The portfolio-search contract: the values a search receives and returns.

Specification, "Proactive observation and portfolio planning". Unbound (``auto``) requests
form a workload forecast kept apart from named-model demand. Each tick the controller takes
one immutable :class:`PortfolioSnapshot` (forecast, candidates with their feasibility and
evidence, the previous choice) and asks the ``grid_search_portfolio`` hook for a
:class:`PortfolioDecision`: one model per admitted workload, or an explicit deferral. The
decision's demand is projected onto models as demand that may fill spare capacity but never
evict (:mod:`grid_core.portfolio.project`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol, runtime_checkable

import msgspec

from grid_core.demand.types import ModelDemand
from grid_core.planner.types import Plan
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

MAX_PORTFOLIOS = 64
"""Distinct portfolios one search may evaluate with the planner (specification: "at most …
64 distinct portfolios", so a catalog's size never makes a planning pass unbounded)."""
MAX_CANDIDATES = 4
"""Candidate models considered per workload (specification: "at most four candidates per
workload")."""
MAX_PREEMPTION_PATHS = 16
"""Ranked preemption paths kept per candidate (specification: "up to sixteen ranked
preemption paths instead of treating the first host as the whole fleet")."""

AdmissionState = Literal[
    "ready",
    "starting",
    "planned",
    "undersupplied",
    "deferred",
    "capacity-contended",
    "blocked-by-residency",
    "infeasible",
    "awaiting-plan",
]
"""Admission state of one active unbound workload (specification's vocabulary)."""


class WorkloadDemand(msgspec.Struct, frozen=True, kw_only=True):
    """Forecast unbound demand of one workload (``model: auto`` traffic classified into it).

    Attributes:
        workload: workload name from the vocabulary.
        request_rate_rps: forecast arrival rate (requests/s).
        service_time_s: measured service time of whatever served it (s), ``None`` unmeasured.
        queue_depth: queued work (mean waiting requests) attributed to the workload.
        offered_concurrency: rate × service time + queued work (Little's law); the service
            time is the measured one, else the fastest candidate's expectation.
        observations: distinct requests within the admission memory (the last hour).
        failure_rate: recent measured request failure (errors, 429s and Grid's own 503s).
        p95_ms: approximate request-level p95 (ms) of served requests, ``None`` unmeasured.
        modality: ``text``, ``image`` or ``video`` (media gets the weak-evidence rule).
        admitted: the admission gate let it into planning.
        admission: why: ``observations``, ``concurrency``, ``weak_media``, ``held`` (admitted
            last tick, its requests still within the admission memory) or ``below_gate``.
        canary_cap: admitted only on weak evidence: at most one replica until a validated
            response lifts the cap.
    """

    workload: str
    request_rate_rps: float = 0.0
    service_time_s: float | None = None
    queue_depth: float = 0.0
    offered_concurrency: float = 0.0
    observations: int = 0
    failure_rate: float = 0.0
    p95_ms: float | None = None
    modality: str = "text"
    admitted: bool = False
    admission: str = "below_gate"
    canary_cap: bool = False


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One model considered for one workload: fit, evidence and the score parts.

    Attributes:
        workload / model_id: the pair.
        suitability: the profile's configured workload score (0..1].
        compatible_hosts: hosts whose immutable facts allow the model (runtime, backend, GPU,
            tags, tier).
        feasible_now: hosts where a new replica fits current headroom with every hard rule
            (memory held by residents, model slots, colocation, disk).
        resident: hosts where it is loading, warming or ready.
        preemption_paths: hosts (ranked, at most :data:`MAX_PREEMPTION_PATHS`) where only
            speculative, unpinned residents above their baseline stand in the way.
        best_host: the best host for a new replica (resident, else feasible, else a path).
        startup_s: fastest load+warm estimate (0 when resident).
        outcome: measured service success in [0, 1] (confidence-weighted toward 1).
        outcome_confidence: effective fresh completions / 20 (capped at 1).
        quality: labelled quality in [0, 1], ``None`` without evaluations.
        quality_confidence: effective fresh evaluations / 8 (capped at 1).
        bonus: remaining exploration (optimism) bonus, points.
        transition_penalty: bounded cold-start/residency penalty, points.
        utility: the score the search ranks by (points, larger is better).
        rejection: why the candidate cannot be used now, or ``None``.
    """

    workload: str
    model_id: str
    suitability: float
    compatible_hosts: int = 0
    feasible_now: int = 0
    resident: int = 0
    preemption_paths: tuple[str, ...] = ()
    best_host: str | None = None
    startup_s: float = 0.0
    outcome: float = 1.0
    outcome_confidence: float = 0.0
    quality: float | None = None
    quality_confidence: float = 0.0
    bonus: float = 0.0
    transition_penalty: float = 0.0
    utility: float = 0.0
    rejection: str | None = None

    @property
    def usable(self) -> bool:
        """Resident, fits now, or has a preemption path (a model no live node can host is
        excluded instead of suppressing a usable fallback)."""
        return self.rejection is None


class PortfolioSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The immutable inputs of one search (every counterfactual reuses this one snapshot).

    Attributes:
        now: planning instant (Unix seconds).
        workloads: forecast unbound demand by workload (admitted or not).
        profiles: the configured model profiles.
        hosts: the current host snapshots (in-flight work applied).
        direct: named-model demand by model id (absolute; a portfolio cannot change it).
        candidates: workload → its candidates, best utility first (at most
            :data:`MAX_CANDIDATES` usable ones plus rejected ones for status).
        previous: the previous tick's mapping (workload → model), for hysteresis.
        exploring: the model that held the exploration slot last tick, if any.
        out_hosts: hosts of the nominal fleet that are out right now (stale or missing
            heartbeat, unhealthy report): they stay in ``hosts`` but take no new work. A
            temporary outage must not switch portfolio policy (specification), so a search
            judges roomy versus scarce on the nominal fleet, these hosts included.
    """

    now: float
    workloads: dict[str, WorkloadDemand]
    profiles: tuple[ModelProfile, ...]
    hosts: tuple[HostSnapshot, ...]
    direct: dict[str, ModelDemand] = {}
    candidates: dict[str, tuple[Candidate, ...]] = {}
    previous: dict[str, str] = {}
    exploring: str | None = None
    out_hosts: tuple[str, ...] = ()


class PortfolioDecision(msgspec.Struct, frozen=True, kw_only=True):
    """A search's answer.

    Attributes:
        mapping: workload → model id for every workload the portfolio serves.
        deferred: workloads deliberately left unserved under current capacity.
        exploring: the one model chosen because of uncertainty (the exploration slot).
        evaluated: portfolios evaluated with the planner.
        reason: one line for status explaining the choice.
    """

    mapping: dict[str, str]
    deferred: tuple[str, ...] = ()
    exploring: str | None = None
    evaluated: int = 0
    reason: str = ""


class PortfolioContext(Protocol):
    """What the controller offers a search: planner-backed evaluation within a budget."""

    budget: int
    """Portfolios the search may still evaluate (at most :data:`MAX_PORTFOLIOS`)."""

    def evaluate(self, mapping: Mapping[str, str]) -> Plan:
        """The fleet plan serving ``mapping`` (workload → model id) would produce.

        Raises:
            StateError: the budget is spent (the search must stop and answer).
        """
        ...


@runtime_checkable
class PortfolioSearch(Protocol):
    """Chooses a portfolio for unbound demand (``grid_search_portfolio``, firstresult)."""

    def __call__(
        self, snapshot: PortfolioSnapshot, ctx: PortfolioContext
    ) -> PortfolioDecision | None:
        """A decision, or ``None`` to fall back to the built-in projection."""
        ...


class AdmissionRow(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to one active unbound workload this tick (status).

    Attributes:
        workload: the workload.
        state: see :data:`AdmissionState`.
        model_id: the chosen model (``None`` when deferred or nothing is usable).
        offered_concurrency: the workload's offered concurrency.
        observations: distinct requests within the admission memory (the last hour).
        desired / planned / ready / missing: replica counts of the chosen model.
        eligible_hosts: hosts that could hold the chosen model (compatible, eligible).
        startup_s: startup estimate of the chosen model's next replica (s).
        reason: one line naming the concrete cause.
    """

    workload: str
    state: AdmissionState
    model_id: str | None = None
    offered_concurrency: float = 0.0
    observations: int = 0
    desired: int = 0
    planned: int = 0
    ready: int = 0
    missing: int = 0
    eligible_hosts: int = 0
    startup_s: float = 0.0
    reason: str = ""


class AdmissionThresholds(msgspec.Struct, frozen=True, kw_only=True):
    """The admission gate's thresholds (persisted with the controller state, shown in status).

    Attributes:
        observations: distinct requests that admit a workload (three by default).
        concurrency: offered-concurrency units that admit it earlier (1.5 by default).
        media_concurrency: image/video units that may earn one canary after a fleet
            spare-capacity proof (1.0 by default).
    """

    observations: int = 3
    concurrency: float = 1.5
    media_concurrency: float = 1.0


class Replacement(msgspec.Struct, frozen=True, kw_only=True):
    """One replacement of speculative residents by a workload's chosen model (status).

    Attributes:
        beneficiary: the model that takes the host; workload: the workload it serves.
        host_id: the host of the path; victims: models whose replica there gives way.
        pressure / victim_pressure: offered concurrency behind each side.
        rule: ``pressure`` (the 1.5x mature-beneficiary rule) or ``starvation`` (an excess
            replica reclaimed to end whole-workload starvation; each victim keeps one copy).
    """

    beneficiary: str
    workload: str
    host_id: str
    victims: tuple[str, ...]
    pressure: float
    victim_pressure: float
    rule: str = "pressure"


class StandbyClaim(msgspec.Struct, frozen=True, kw_only=True):
    """A standing standby decision for one unadmitted workload (status).

    Attributes:
        model_id: the workload's leader that stood by.
        stood_by_at: the last planning instant it stood by on idle capacity (Unix seconds).
    """

    model_id: str
    stood_by_at: float


class PortfolioReport(msgspec.Struct, frozen=True, kw_only=True):
    """The portfolio part of status: the decision, its inputs and the admission rows.

    Attributes:
        plugin: the plugin that answered (``builtin-projection`` when none did).
        mapping: workload → model chosen.
        models: the selected model set.
        deferred: workloads deferred under current capacity.
        exploring: the model holding the exploration slot.
        evaluated: portfolios evaluated this tick.
        reason: the search's one-line reason.
        thresholds: the admission gate in force.
        workloads: the workload forecasts.
        candidates: candidate rows (feasibility and evidence) per workload.
        admissions: one row per active unbound workload.
        replacing: the one speculative replacement this tick uses, if any.
        standby: workload → model kept on idle capacity before the workload is admitted
            (:mod:`grid_core.portfolio.standby`).
        standby_reason: why standby holds what it holds (or nothing) this tick.
        standby_claims: workload → the standby decision that stands while the workload stays
            unadmitted, even when real demand borrows the host (the leader returns to an
            idle host inside the reserve; :func:`~grid_core.portfolio.standby.claims`).
    """

    plugin: str = "builtin-projection"
    mapping: dict[str, str] = {}
    models: list[str] = []
    deferred: list[str] = []
    exploring: str | None = None
    evaluated: int = 0
    reason: str = ""
    thresholds: AdmissionThresholds = AdmissionThresholds()
    workloads: list[WorkloadDemand] = []
    candidates: list[Candidate] = []
    admissions: list[AdmissionRow] = []
    replacing: Replacement | None = None
    standby: dict[str, str] = {}
    standby_reason: str = ""
    standby_claims: dict[str, StandbyClaim] = {}
