"""Inferred demand: learned sequences and co-activation turned into opportunistic demand.

Source: specification, "Global placement loop" (correlation-derived demand keeps a separate
observed-rate field; within one priority class baseline places first, then direct evidence,
then inferred-only prewarms, which never authorize a preemption) and "Proactive observation
and portfolio planning" (sequence proof, status labels each proactive decision with its
learned edge and confidence).

:func:`infer_demand` is the default answer of the ``grid_infer_demand`` hook (the built-in
``grid_sequence`` plugin); :func:`apply_inferred` folds the rows into the planner's demand.
Pure: time and every fact are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol, TypeVar

import msgspec

from grid_core.demand.coactivation import CoActivationBook
from grid_core.demand.features import WORKLOADS
from grid_core.demand.sequence import WORKLOAD_PREFIX, SequenceBook
from grid_core.demand.types import ModelDemand
from grid_core.demand.workloads import projection_map
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

MIN_RATE_WINDOW_S = 30.0
"""Shortest window a predicted session's request is spread over (s): a lead time of two
seconds must not turn one expected request into a burst that asks for many replicas."""
MAX_RATE_WINDOW_S = 600.0
"""Longest window (s): a slow workflow still predicts at least one request per ten minutes."""
DEFAULT_RATE_WINDOW_S = 60.0
"""Window used while an edge has no learned lead time (one planning minute)."""

InferenceKind = Literal["sequence", "group", "pair"]


class InferenceSource(Protocol):
    """What answers the ``grid_infer_demand`` hook (the plugin facade's ``infer_demand``)."""

    def __call__(
        self,
        sequences: SequenceBook,
        coactivation: CoActivationBook,
        demand: Mapping[str, ModelDemand],
        workload_models: Mapping[str, str],
        now: float,
    ) -> list[InferredDemand]:
        """Inferred demand rows (empty when no plugin answers)."""
        ...


class InferredDemand(msgspec.Struct, frozen=True, kw_only=True):
    """Demand inferred for one configured model, with the evidence status shows.

    Attributes:
        model_id: target model.
        kind: ``sequence`` (affinity-key workflow), ``group`` or ``pair`` (co-activation).
        edge: the learned edge, ``source→target`` (stages or model ids).
        confidence: the edge's confidence / association share (0..1).
        support: transitions (sequence) or supporting buckets (co-activation).
        rate_rps: inferred requests/s.
        lead_s: learned median lead time (sequence only), ``None`` when unknown.
        due_at: when the predicted request is expected (Unix seconds), ``None`` when unknown.
    """

    model_id: str
    kind: InferenceKind
    edge: str
    confidence: float
    support: int
    rate_rps: float
    lead_s: float | None = None
    due_at: float | None = None


def infer_demand(
    sequences: SequenceBook,
    coactivation: CoActivationBook,
    demand: Mapping[str, ModelDemand],
    workload_models: Mapping[str, str],
    now: float,
) -> list[InferredDemand]:
    """Inferred demand rows for this planning instant, at most one per (model, kind).

    Args:
        sequences: learned affinity-key workflows.
        coactivation: learned model co-activation.
        demand: this tick's demand per configured model; models with ``direct`` evidence are
            the co-activation sources (an inferred model never is: no transitivity).
        workload_models: workload → model currently chosen for it (the portfolio's mapping,
            else the best feasible model); a predicted workload stage lands on that model.
        now: planning instant (Unix seconds).

    Returns:
        Rows sorted by (model, kind); a target with direct evidence gets none.
    """
    rows: dict[tuple[str, str], InferredDemand] = {}
    for p in sequences.predict(now):
        target = p.target
        if target.startswith(WORKLOAD_PREFIX):
            mapped = workload_models.get(target[len(WORKLOAD_PREFIX) :])
            if mapped is None:
                continue
            target = mapped
        d = demand.get(target)
        if d is None or d.direct:
            continue
        window = p.lead_s if p.lead_s is not None else DEFAULT_RATE_WINDOW_S
        window = min(MAX_RATE_WINDOW_S, max(MIN_RATE_WINDOW_S, window))
        row = InferredDemand(
            model_id=target,
            kind="sequence",
            edge=p.edge,
            confidence=p.confidence,
            support=p.repeats,
            rate_rps=round(p.expected_sessions / window, 9),
            lead_s=p.lead_s,
            due_at=p.due_at,
        )
        old = rows.get((target, "sequence"))
        if old is None or row.rate_rps > old.rate_rps:  # the maximum, never the sum
            rows[(target, "sequence")] = row
    direct_rps = {m: d.request_rate_rps for m, d in demand.items() if d.direct}
    for r in coactivation.infer(now, direct_rps):
        if r.target not in demand:
            continue
        rows[(r.target, r.kind)] = InferredDemand(
            model_id=r.target,
            kind=r.kind,
            edge=f"{r.source}→{r.target}",
            confidence=r.association,
            support=r.support,
            rate_rps=r.rate_rps,
        )
    return [rows[k] for k in sorted(rows)]


def apply_inferred(
    demand: Mapping[str, ModelDemand],
    rows: Sequence[InferredDemand],
    profiles: Mapping[str, ModelProfile],
) -> dict[str, ModelDemand]:
    """Fold inferred rows into demand as opportunistic, never-preempting demand.

    A model with direct evidence is left exactly as it is. Otherwise its ``inferred_rps`` grows
    by the largest inferred rate (maximum across rows, never their sum), it asks for at least
    one replica (within ``max_replicas``) and ``direct`` stays false: the planner places it
    after baseline and direct demand, on spare capacity only, and it never authorizes a
    preemption. Queue, latency and error evidence are never touched.

    Returns:
        A new demand map (the input is not modified).
    """
    out = dict(demand)
    best: dict[str, InferredDemand] = {}
    for r in rows:
        if r.model_id not in best or r.rate_rps > best[r.model_id].rate_rps:
            best[r.model_id] = r
    for model_id, r in sorted(best.items()):
        d = out.get(model_id)
        p = profiles.get(model_id)
        if d is None or p is None or d.direct or r.rate_rps <= 0 or p.max_replicas < 1:
            continue
        out[model_id] = msgspec.structs.replace(
            d,
            desired_replicas=max(d.desired_replicas, 1),
            inferred_rps=d.inferred_rps + r.rate_rps,
            reasons=(*d.reasons, r.kind),
        )
    return out


def workload_models(
    chosen: Mapping[str, str],
    profiles: Sequence[ModelProfile],
    hosts: Sequence[HostSnapshot],
    policy: object | None,
    sessions: int,
) -> dict[str, str]:
    """Workload → model a predicted workload stage lands on: the portfolio's choice, else
    the best feasible model (the projection the portfolio itself falls back to).

    ``sessions`` is the number of live affinity sessions; with none nothing can be
    predicted, and the projection scan is skipped.
    """
    if not sessions:
        return dict(chosen)
    out = dict(projection_map(WORKLOADS, profiles, hosts, policy))
    out.update(chosen)
    return out


class _Placed(Protocol):
    @property
    def host_id(self) -> str: ...

    @property
    def model_id(self) -> str: ...

    @property
    def incumbent(self) -> bool: ...


class _Short(Protocol):
    @property
    def model_id(self) -> str: ...


class _Staged(Protocol):
    @property
    def model_id(self) -> str: ...

    @property
    def host_id(self) -> str: ...

    @property
    def beneficiary(self) -> str | None: ...


class PlanLike(Protocol):
    """The part of a planner ``Plan`` this module reads."""

    @property
    def assignments(self) -> Sequence[_Placed]: ...

    @property
    def evictions(self) -> Sequence[_Staged]: ...

    @property
    def unmet(self) -> Sequence[_Short]: ...


P = TypeVar("P", bound=PlanLike)

Released = frozenset[tuple[str, str]]
"""(model id, host id) residencies a hypothetical plan treats as already gone."""


def plan_with_predictions(
    plan_of: Callable[[dict[str, ModelDemand], Released], P],
    demand: Mapping[str, ModelDemand],
    rows: Sequence[InferredDemand],
    profiles: Mapping[str, ModelProfile],
) -> tuple[P, dict[str, ModelDemand]]:
    """The authoritative plan, with predictions only where they displace nothing.

    Prediction is opportunistic (specification, "Global placement loop"): it may use capacity
    nothing else wants. Workload demand projected by the portfolio is also non-direct, so the
    planner alone would let a predicted model compete with it for a spare slot. This plans
    without the predictions, then with them, and keeps the second plan only if

    * every (model, host) the first one assigned to a model with demand of its own is still
      there, and every preemption it staged for such a model too. A model that has its own
      demand (direct, baseline, hold or workload projection) and gets a prediction on top
      counts as real here: the prediction adds to its demand, it must not cost it the host
      the first plan gave it (:func:`_guess_only`); and
    * no replica the first plan releases is kept by a prediction alone while real demand waits
      for its room. A release is staged (unload first, place later), so the waiting model is
      not yet assigned in the first plan: a third plan, without predictions and with the kept
      replicas treated as gone, shows whether real demand would take their hosts. It runs
      only when a prediction holds a released replica and the first plan left something
      unmet.

    Otherwise the predictions get no serving slot (they may still earn a cache-only prefetch).

    Args:
        plan_of: (demand, residencies treated as gone) → the planner's plan.
        demand: this tick's demand (direct, baseline, workload projection).
        rows: inferred demand rows.
        profiles: configured models by id.

    Returns:
        (plan, the demand it was made for).
    """
    base = plan_of(dict(demand), frozenset())
    applied = apply_inferred(demand, rows, profiles)
    if applied == dict(demand):
        return base, applied
    predicted = {m for m in applied if applied[m] is not demand.get(m)}
    candidate = plan_of(applied, frozenset())
    if not _keeps_base(base, candidate, _guess_only(demand, predicted)):
        return base, dict(demand)
    base_pairs = {(a.model_id, a.host_id) for a in base.assignments}
    held = frozenset(
        (a.model_id, a.host_id)
        for a in candidate.assignments
        if a.incumbent and a.model_id in predicted and (a.model_id, a.host_id) not in base_pairs
    )
    if held and base.unmet:
        # Planned from the demand without predictions: every new assignment is real demand.
        after = plan_of(dict(demand), held)
        hosts = {h for _, h in held}
        if any(
            a.host_id in hosts and (a.model_id, a.host_id) not in base_pairs
            for a in after.assignments
        ):
            return base, dict(demand)
    return candidate, applied


def _guess_only(demand: Mapping[str, ModelDemand], predicted: set[str]) -> set[str]:
    """The models of ``predicted`` that want replicas only because of a prediction: no
    replica of their own demand (``desired_replicas`` is 0 before the rows are applied).

    :func:`plan_with_predictions` lets only these give up what the plan without predictions
    gave them. A model whose own demand already asks for a replica keeps that protection when
    a prediction is folded into it, so another model's prediction cannot take its host.
    """
    return {m for m in predicted if not demand[m].desired_replicas}


def without_residencies(
    hosts: Sequence[HostSnapshot], released: Released
) -> tuple[HostSnapshot, ...]:
    """``hosts`` with the ``released`` (model, host) residencies removed (a hypothetical fleet
    for :func:`plan_with_predictions`'s third plan; the input is unchanged)."""
    out = []
    for h in hosts:
        keep = tuple(r for r in h.residencies if (r.model_id, h.host_id) not in released)
        same = len(keep) == len(h.residencies)
        out.append(h if same else msgspec.structs.replace(h, residencies=keep))
    return tuple(out)


def _keeps_base(base: PlanLike, candidate: PlanLike, predicted: set[str]) -> bool:
    """Whether ``candidate`` keeps every assignment and staged preemption ``base`` made for
    models outside ``predicted`` (the models that may give theirs up)."""
    kept = {(a.model_id, a.host_id) for a in candidate.assignments}
    staged = {(e.model_id, e.host_id, e.beneficiary) for e in candidate.evictions}
    return all(
        (a.model_id, a.host_id) in kept for a in base.assignments if a.model_id not in predicted
    ) and all(
        (e.model_id, e.host_id, e.beneficiary) in staged
        for e in base.evictions
        if e.beneficiary not in predicted
    )
