"""Replacing speculative capacity: whole-workload starvation and the 1.5× rule.

Specification, "Proactive observation and portfolio planning": a newly active workload must
not stay invisible behind a full model slot held by an idle speculative model. A *mature*
beneficiary (admitted by ordinary evidence, not a weak media canary) whose workload pressure
is at least :data:`REPLACEMENT_RATIO` times the pressure that justifies the incumbent may use
one exact replacement path per tick. Victims are only idle, managed residents of models with
no direct demand, no pin and no baseline (pinned models, minimum replicas and directly named
demand stay absolute fences). The replacement only withdraws the victim's *workload*
justification: the victim's demand drops by one replica, the planner — seeing the victim's
replica on that host as leaving (:func:`leaving`) — proves the resulting plan no longer keeps
it there, and the reconciler drains before it unloads. Nothing is treated as free until a
later heartbeat proves it. The path is carried forward (:func:`carried`) while its victims
stay removable, so a drain under way is finished rather than replaced by another path.

Before that rule, whole-workload starvation is ended: when a clean structural plan proves
that the fleet (without its managed residents) can host one preferred model for every active
workload, an *excess* replica of another model may give way to a workload whose chosen model
has no replica and no headroom anywhere. One copy of each active model stays (the victim's
ready-replica floor); pins and directly named demand stay absolute fences. The controller
takes the first of the ranked paths (at most sixteen) that preserves every floor, and carries
the authorization forward until the beneficiary is ready, so the freed host is not refilled
by the victim's own leftover demand in between.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from grid_core.demand.types import ModelDemand
from grid_core.portfolio.feasibility import PRESENT, SERVING, Fit
from grid_core.portfolio.types import Candidate, Replacement, WorkloadDemand
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

REPLACEMENT_RATIO = 1.5
"""Beneficiary pressure over incumbent pressure needed to replace it (specification: "at
least 1.5× the incumbent's … device-time pressure"); the reverse swap then needs the
incumbent to triple, so two workloads never trade a slot back and forth."""
MAX_REPLACEMENTS = 1
"""Exact replacement paths one tick may use (specification: "one exact planner-proved
replacement path")."""
MAX_PATH_PROOFS = 4
"""Ranked starvation paths one tick asks the planner to prove (each proof is one full plan):
the cheapest-startup paths come first, so a few proofs find the usable one without letting
a fleet with many blocked hosts multiply the planning pass."""
MATURE = frozenset({"observations", "concurrency"})
"""Admissions that count as mature evidence (a weak media canary never replaces anything)."""


def _pressure(
    mapping: Mapping[str, str], workloads: Mapping[str, WorkloadDemand]
) -> dict[str, float]:
    out: dict[str, float] = {}
    for w, m in mapping.items():
        out[m] = out.get(m, 0.0) + workloads[w].offered_concurrency
    return out


def find_replacement(
    mapping: Mapping[str, str],
    workloads: Mapping[str, WorkloadDemand],
    candidates: Mapping[str, tuple[Candidate, ...]],
    hosts: tuple[HostSnapshot, ...],
    protected: frozenset[str],
) -> Replacement | None:
    """The first ranked path (at most sixteen per candidate) the rule allows, or ``None``.

    Args:
        mapping: the decision's workload → model map.
        workloads: admitted workload forecasts.
        candidates: candidate rows (their ranked preemption paths).
        hosts: host snapshots.
        protected: models with direct demand, pins or a baseline (never victims).
    """
    pressure = _pressure(mapping, workloads)
    by_host = {h.host_id: h for h in hosts}
    order = sorted(mapping, key=lambda w: (-workloads[w].offered_concurrency, w))
    for w in order:
        model = mapping[w]
        if workloads[w].admission not in MATURE:
            continue
        cand = next((c for c in candidates.get(w, ()) if c.model_id == model), None)
        if cand is None or cand.resident or cand.feasible_now or not cand.preemption_paths:
            continue
        need = pressure.get(model, 0.0)
        for host_id in cand.preemption_paths:
            host = by_host[host_id]
            victims = tuple(
                sorted(
                    r.model_id
                    for r in host.residencies
                    if r.state in SERVING
                    and r.actuatable
                    and r.active_requests == 0
                    and r.model_id not in protected
                )
            )
            held = sum(pressure.get(v, 0.0) for v in victims)
            if victims and need > 0 and need >= REPLACEMENT_RATIO * held:
                return Replacement(
                    beneficiary=model,
                    workload=w,
                    host_id=host_id,
                    victims=victims,
                    pressure=round(need, 4),
                    victim_pressure=round(held, 4),
                )
    return None


def starving(
    mapping: Mapping[str, str], workloads: Mapping[str, WorkloadDemand], fit: Fit
) -> list[str]:
    """Admitted workloads whose chosen model has no replica and fits no host's headroom,
    by descending offered concurrency (ties: name)."""
    out = []
    for w, m in mapping.items():
        row = fit.row(m)
        if row.resident == 0 and row.feasible == 0 and row.compatible > 0:
            out.append(w)
    return sorted(out, key=lambda w: (-workloads[w].offered_concurrency, w))


def starvation_paths(
    mapping: Mapping[str, str], workloads: Mapping[str, WorkloadDemand], fit: Fit
) -> list[Replacement]:
    """Every ranked reclaim path of every starving workload, in the order to try them.

    Called only once a clean structural plan has proven that the fleet can host one chosen
    model per active workload (:func:`~grid_core.portfolio.run.structural_fit`). Under that
    proof the specification protects one copy of each active model and lets any further
    replica be reclaimed to end whole-workload starvation; the demand-derived floor is what
    a fleet that cannot hold the complete portfolio keeps (there no path is tried at all).
    So each victim keeps one ready replica on another host
    (:meth:`~grid_core.portfolio.feasibility.Fit.reclaim_paths`'s default floor); its traffic
    moves to the kept copies while the reconciler drains the reclaimed one.
    """
    pressure = _pressure(mapping, workloads)
    out = []
    for w in starving(mapping, workloads, fit):
        m = mapping[w]
        for path in fit.reclaim_paths(m, {}):
            out.append(
                Replacement(
                    beneficiary=m,
                    workload=w,
                    host_id=path.host_id,
                    victims=path.victims,
                    pressure=round(pressure.get(m, 0.0), 4),
                    victim_pressure=round(sum(pressure.get(v, 0.0) for v in path.victims), 4),
                    rule="starvation",
                )
            )
    return out


def carried(
    previous: Replacement | None,
    mapping: Mapping[str, str],
    hosts: tuple[HostSnapshot, ...],
    out: frozenset[str] = frozenset(),
    degraded: frozenset[tuple[str, str]] = frozenset(),
) -> Replacement | None:
    """Last tick's replacement, while it is still in progress: its workload still maps to the
    beneficiary and the beneficiary is not ready on a live host yet (a starvation path also
    needs each victim's copy on another live host; ``out`` are the hosts that are out, whose
    last reports still list replicas that died with them). Nor has a beneficiary replica
    listed in ``degraded`` (``(host id, model id)`` pairs from
    :meth:`~grid_core.portfolio.feasibility.Fit.degraded_pairs`): it sits on a throttled
    host where one of its requests outlasts the protection grace — the reason its workload
    starved — so it cannot end the path that gives the workload a host it can serve from
    (specification, host protection: a throttled host yields capacity). Both rules are carried
    (specification: the controller carries the replacement authorization forward), so a path
    whose victim is already draining is finished instead of a different path being started
    every tick as idle residents and pressures move. It ends when another model took the
    path host after the victim left (:func:`_taken`)."""
    if previous is None:
        return None
    if mapping.get(previous.workload) != previous.beneficiary:
        return None
    path = next((h for h in hosts if h.host_id == previous.host_id), None)
    if path is None or _taken(path, previous):
        return None
    for v in previous.victims if previous.rule == "starvation" else ():
        if not any(
            r.model_id == v and r.state in SERVING
            for h in hosts
            if h.host_id != previous.host_id and h.host_id not in out
            for r in h.residencies
        ):
            return None
    if any(
        r.model_id == previous.beneficiary
        and r.state == "ready"
        and (h.host_id, r.model_id) not in degraded
        for h in hosts
        if h.host_id not in out
        for r in h.residencies
    ):
        return None
    return previous


def _taken(host: HostSnapshot, rep: Replacement) -> bool:
    """Whether another model took the path host of ``rep``: no victim is left there, and a
    model other than the beneficiary is loading, warming or ready on it (e.g. direct demand
    placed there once the victim left). The authorization has nothing left to hold then."""
    present = {r.model_id for r in host.residencies if r.state in PRESENT}
    if present & set(rep.victims):
        return False
    return any(m != rep.beneficiary for m in present)


def leaving(hosts: tuple[HostSnapshot, ...], rep: Replacement | None) -> tuple[HostSnapshot, ...]:
    """``hosts`` as the planner should see them while ``rep`` is in force: each victim's
    serving replica on the path host shows as ``draining``.

    A draining replica is leaving for good: the planner does not keep it as an incumbent
    (it keeps the victim's copies on other hosts instead, where :func:`release` leaves its
    demand) yet still counts the memory and slot it holds, so the beneficiary is placed there
    only once a heartbeat reports the host free. Without this the planner could satisfy the
    victim's reduced demand by keeping the path host's replica and dropping one elsewhere —
    a host the beneficiary may not even be able to use (the same view the controller gives
    an eviction drain in flight, :func:`~grid_core.reconcile.control.with_in_flight`).
    Returns ``hosts`` itself when ``rep`` is ``None``; the input is never changed.
    """
    if rep is None:
        return hosts
    out = []
    for h in hosts:
        if h.host_id != rep.host_id:
            out.append(h)
            continue
        res = tuple(
            msgspec.structs.replace(r, state="draining")
            if r.model_id in rep.victims and r.state in SERVING
            else r
            for r in h.residencies
        )
        out.append(msgspec.structs.replace(h, residencies=res))
    return tuple(out)


def release(
    demand: Mapping[str, ModelDemand],
    rep: Replacement,
    profiles: Mapping[str, ModelProfile],
    hosts: tuple[HostSnapshot, ...],
) -> dict[str, ModelDemand]:
    """Demand with each victim asking only for the replicas it has on other hosts (never
    below its baseline), its hold released, so the planner drops the replica on the path
    host and does not put it back there while the beneficiary waits for the drain."""
    out = dict(demand)
    for v in rep.victims:
        p = profiles.get(v)
        if p is None:
            continue
        others = sum(
            1
            for h in hosts
            if h.host_id != rep.host_id
            for r in h.residencies
            if r.model_id == v and r.state in SERVING
        )
        d = out.get(v) or ModelDemand(model_id=v)
        want = max(p.min_replicas, others)
        out[v] = msgspec.structs.replace(
            d, desired_replicas=want, held_replicas=0, reasons=(*d.reasons, "replaced")
        )
    return out
