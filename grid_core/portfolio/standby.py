"""Standby: idle capacity holds each workload's chosen model before its first request.

Specification, "Proactive observation and portfolio planning": counterfactual portfolio
demand is weaker than direct evidence — it may fill spare capacity but never evicts, and
direct demand reclaims it first. A static configuration places one model per workload before
anyone asks; an allocator that waits for the admission gate instead loses the first jobs of
every sparse workload to a cold start (on the lab's 8-machine fleet, most of the video
workload's few long jobs). Standby closes that gap without giving speculation any authority:

1. The tick's *real* plan (direct, baseline and admitted-workload demand) is computed first.
2. A host is *idle* when that plan assigns nothing to it and no model the plan leaves short
   could ever use it (compatible and large enough once emptied): standby never sits on
   capacity real demand is waiting for, so a standby replica there is withdrawn (and drained
   by the ordinary reconciler guards) as soon as real demand could use its host. Idle slots
   up to the spare-capacity reserve (one unseen workload and one node failure) stay empty:
   on a small fleet that margin is all the spare there is. The unseen-workload slot is kept
   for a workload that would otherwise find no model; when the leaders of every unadmitted
   workload stand by within the slots beyond the node-failure reserve, none is left, so only
   the node-failure slot stays empty (:func:`covered_room`).
3. Every workload the catalogue scores that is not admitted (unseen, or below the admission
   gate) asks for its exploitation leader — the best candidate by configured suitability,
   evidence and transition cost, without the optimism bonus — when that model already
   stands by on an idle host or fits one now. Workloads that share a leader share one replica.
4. The standby demand is one replica per model, marked :data:`STANDBY_REASON`: the planner
   places it after every evidence-backed round of its class and never gives it preemption
   authority. The plan with standby must keep every real model's placements; otherwise the
   tick runs without standby (the proof, :func:`displaced`).

When several standby models compete for fewer idle hosts, the ones whose workloads were seen
(higher forecast rate) come first, then the longest cold start (a standby saves exactly that
start), then the workload name, so the choice is deterministic.

The reserve gates *new* standby decisions only. A leader already standing by on an idle host
keeps its replica even when the idle slots no longer exceed the reserve (:func:`kept_standby`):
step 2 already withdraws it the moment real demand could use its host, so an empty reserve
slot and an idle standby replica differ by one drain of an idle engine, while unloading it
only to leave the slot empty costs a mutation now and the workload's whole cold start later
(specification, "Safety invariants" 8: bound change; on the lab's 8-machine fleet the video
model was unloaded from a host that then stayed idle until the first video job arrived).

For the same reason a standby decision outlives a loan of its host to real demand
(:func:`claims`): while the workload stays unadmitted and its leader is unchanged, the leader
returns to an idle host inside the reserve once real demand has released one. Real demand
took the host through step 2 and gave it back, which leaves the fleet where it was when the
standby was decided; the reserve already held then. The return waits one minimum residency
of the leader after its replica left (:func:`returning`): a standby load holds its host for
that long, so returning sooner would make the borrower, whose demand may still be settling,
wait a whole residency for the host it was just given. (On the lab's 8-machine fleet, seed
11, the coding surge borrowed the rtx host the video model stood by on; afterwards the host
stayed idle behind the reserve until the first video job arrived and found nothing ready.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from grid_core.demand.types import STANDBY_REASON, ModelDemand
from grid_core.planner.types import Plan
from grid_core.portfolio.feasibility import SERVING, Fit
from grid_core.portfolio.types import Candidate, StandbyClaim, WorkloadDemand

STANDBY_REPLICAS = 1
"""Replicas a standby model asks for: one copy removes the cold start of a first request;
more would be capacity planning without any evidence."""
RESERVED_UNSEEN_WORKLOADS = 1
"""Idle model slots standby leaves free for a workload nobody has asked for yet — the same
reserve as the fleet spare-capacity proof (specification: "preserves slots for one unseen
workload and one node failure"); the node-failure part is the most models any one host
holds (:func:`standby_slots`)."""


def catalogue_workloads(fit: Fit) -> tuple[str, ...]:
    """Every workload some configured model scores above zero, sorted."""
    return tuple(sorted({w for p in fit.profiles for w, s in p.workload_scores.items() if s > 0}))


def idle_hosts(plan: Plan, fit: Fit) -> tuple[int, ...]:
    """Indexes (into ``fit.hosts``) of eligible hosts the real ``plan`` leaves idle.

    A host is idle when the plan assigns nothing to it, no staged preemption targets it, and
    no model the plan leaves short could use it once emptied (compatible, and its footprint
    fits the host's allocatable memory).
    """
    busy = {a.host_id for a in plan.assignments} | {e.host_id for e in plan.evictions}
    short = {u.model_id for u in plan.unmet if u.missing > 0 and u.model_id in fit.ledger.index}
    ledger = fit.ledger
    out = []
    for hi, host in enumerate(fit.hosts):
        if host.host_id in busy or not ledger.books[hi].eligible:
            continue
        if ledger.ineligible[hi] is not None:
            continue
        wanted = False
        for m in short:
            mi = ledger.index[m]
            if ledger.compat(mi, hi) is None and ledger.memory(mi, hi)[1] <= (
                host.allocatable_mb - host.external_used_mb
            ):
                wanted = True
                break
        if not wanted:
            out.append(hi)
    return tuple(out)


def standby_slots(fit: Fit, hosts: tuple[int, ...], unseen: int = RESERVED_UNSEEN_WORKLOADS) -> int:
    """Standby models the idle ``hosts`` may hold: their model slots (an unknown limit counts
    as one: no hypothetical headroom) minus the reserve for ``unseen`` unseen workloads and
    one node failure (the most models any eligible host holds, at least one). A small fleet
    whose spare capacity is only that reserve gets no standby: it is not idle, it is the
    fleet's margin."""
    ledger = fit.ledger
    # The real plan keeps nothing on an idle host, so every slot of it is standby's to use
    # (a standby model already there included).
    free = sum(ledger.books[hi].max_models or 1 for hi in hosts)
    largest = max((len(b.present) for b in ledger.books if b.eligible), default=0)
    return max(0, free - unseen - max(1, largest))


def covered_room(fit: Fit, hosts: tuple[int, ...], leaders: set[str], uncovered: bool) -> int:
    """Standby slots when the unseen-workload reserve has nothing left to wait for: the idle
    slots beyond the node-failure reserve, if the ``leaders`` of every unadmitted workload
    (none ``uncovered``: each leader is planned, resident or fits an idle host) all fit in
    them; otherwise 0 (the ordinary reserve applies)."""
    room = standby_slots(fit, hosts, unseen=0)
    return room if not uncovered and len(leaders) <= room else 0


def kept_standby(fit: Fit, model_id: str, hosts: tuple[int, ...]) -> bool:
    """Whether ``model_id`` already stands by: loading, warming or ready on an idle host."""
    for hi in hosts:
        res = fit.hosts[hi].residency(model_id)
        if res is not None and res.state in SERVING:
            return True
    return False


def claims(
    previous: Mapping[str, StandbyClaim],
    chosen: Mapping[str, str],
    workloads: Mapping[str, WorkloadDemand],
    leader: Callable[[str], str | None],
    now: float,
    present: frozenset[str] = frozenset(),
) -> dict[str, StandbyClaim]:
    """Standby decisions that stand after this tick: last tick's claims and this tick's
    choices, for workloads still unadmitted whose leader is still the claimed model. A claim
    whose model was chosen now, or is still on some host (loading to draining), stood by at
    ``now``: the return dwell (:func:`returning`) counts from when its replica left.

    Args:
        previous: last tick's claims.
        chosen: this tick's standby choices (workload → model).
        workloads: this tick's workload forecasts.
        leader: workload → its exploitation leader now (``None`` when none is usable).
        now: planning instant (Unix seconds).
        present: models with a replica on some host (loading, warming, ready or draining).
    """
    merged = dict(previous)
    merged.update({w: StandbyClaim(model_id=m, stood_by_at=now) for w, m in chosen.items()})
    out: dict[str, StandbyClaim] = {}
    for w, c in sorted(merged.items()):
        d = workloads.get(w)
        if (d is None or not d.admitted) and leader(w) == c.model_id:
            out[w] = (
                StandbyClaim(model_id=c.model_id, stood_by_at=now) if c.model_id in present else c
            )
    return out


def returning(standing: Mapping[str, StandbyClaim], fit: Fit, now: float) -> dict[str, str]:
    """Workload → model of the standing claims whose leader may return now: at least one
    minimum residency of the model (its profile's ``min_residency_s``) after its replica
    last stood by or left (:func:`claims`)."""
    out: dict[str, str] = {}
    for w, c in standing.items():
        p = fit.by_id.get(c.model_id)
        if p is not None and now - c.stood_by_at >= p.min_residency_s:
            out[w] = c.model_id
    return out


def leader_of(candidates: tuple[Candidate, ...]) -> Candidate | None:
    """The exploitation leader: the usable candidate with the best utility without the
    optimism bonus (ties: model id)."""
    usable = [c for c in candidates if c.usable]
    if not usable:
        return None
    return min(usable, key=lambda c: (-(c.utility - c.bonus), c.model_id))


def _stands_by(fit: Fit, model_id: str, hosts: tuple[int, ...]) -> bool:
    """Whether ``model_id`` is resident on, or fits now on, one of ``hosts``."""
    ledger = fit.ledger
    mi = ledger.index.get(model_id)
    if mi is None:
        return False
    for hi in hosts:
        res = fit.hosts[hi].residency(model_id)
        if res is not None and res.state in SERVING:
            return True
        if ledger.compat(mi, hi) is None and ledger.fit_new(mi, hi) is None:
            return True
    return False


def _resident_elsewhere(fit: Fit, model_id: str, hosts: tuple[int, ...]) -> bool:
    """Whether ``model_id`` is serving on a host that is *not* idle (so a standby demand for
    it would keep that replica on capacity real demand may want)."""
    idle = {fit.hosts[hi].host_id for hi in hosts}
    for host in fit.hosts:
        if host.host_id in idle:
            continue
        res = host.residency(model_id)
        if res is not None and res.state in SERVING:
            return True
    return False


def choose_standby(
    plan: Plan,
    fit: Fit,
    workloads: Mapping[str, WorkloadDemand],
    candidates: Callable[[str], tuple[Candidate, ...]],
    claimed: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], str]:
    """Workload → standby model for every non-admitted workload whose leader can stand by,
    and, when that map is empty, why (one line for status; ``""`` otherwise).

    Args:
        plan: the tick's real plan (without standby).
        fit: the tick's feasibility scan.
        workloads: the tick's workload forecasts (admitted ones are skipped: the portfolio
            already chose for them, or deliberately deferred them).
        candidates: workload → its ranked candidate rows.
        claimed: workload → model of the standing standby decisions whose leaders may
            return (:func:`returning`): they go to an idle host inside the reserve, like a
            leader already standing by.

    Returns:
        The chosen map, in the module's order of precedence (only models that are not
        already in the real plan), and the reason (:func:`_none_reason`).
    """
    hosts = idle_hosts(plan, fit)
    if not hosts:
        return {}, "no idle host: the real plan uses every host, or a short model could"
    room = standby_slots(fit, hosts)
    planned = {a.model_id for a in plan.assignments}
    rows = []
    skipped: dict[str, list[str]] = {"planned": [], "elsewhere": [], "unfit": []}
    for w in catalogue_workloads(fit):
        d = workloads.get(w)
        if d is not None and d.admitted:
            continue
        leader = leader_of(candidates(w))
        if leader is None:
            continue
        m = leader.model_id
        if m in planned:
            skipped["planned"].append(f"{w}->{m}")  # real demand already keeps it resident
            continue
        if _resident_elsewhere(fit, m, hosts):
            skipped["elsewhere"].append(f"{w}->{m}")
            continue
        if not _stands_by(fit, m, hosts):
            skipped["unfit"].append(f"{w}->{m}")
            continue
        rate = d.request_rate_rps if d is not None else 0.0
        kept = kept_standby(fit, m, hosts) or (claimed or {}).get(w) == m
        rows.append((not kept, -rate, -leader.startup_s, w, m))
    rows.sort()
    # The unseen-workload reserve keeps a slot for a workload nobody asked for yet; when the
    # leaders of every such workload stand by within the slots beyond the node-failure
    # reserve, no workload is left for it to serve (:func:`covered_room`).
    uncovered = bool(skipped["unfit"])  # a leader that could not stand by anywhere idle
    room = max(room, covered_room(fit, hosts, {m for *_, m in rows}, uncovered))
    # Leaders already standing by, or returning after a loan, keep their slots (the reserve
    # gates new standby decisions only).
    room = max(room, len({m for new, *_, m in rows if not new}))
    out: dict[str, str] = {}
    models: set[str] = set()
    for _, _, _, w, m in rows:
        if m not in models and len(models) >= room:
            continue  # the idle slots beyond the reserve are taken
        models.add(m)
        out[w] = m
    return out, "" if out else _none_reason(len(hosts), bool(rows), skipped)


def _none_reason(idle: int, wanted: bool, skipped: Mapping[str, list[str]]) -> str:
    """Why standby holds nothing although ``idle`` hosts are idle: leaders that could stand
    by (``wanted``) found every idle slot inside the reserve; otherwise each unadmitted
    workload's leader was already planned by real demand, serving on a busy host, or fits no
    idle host (``skipped``: kind → ``workload->model`` entries)."""
    if wanted:
        return (
            f"the {idle} idle host(s) are the spare-capacity reserve (one unseen workload, "
            "one node failure)"
        )
    kinds = (
        ("planned", "already planned by real demand"),
        ("elsewhere", "already serving on a busy host"),
        ("unfit", "fits no idle host"),
    )
    parts = [f"{what}: {', '.join(skipped[k])}" for k, what in kinds if skipped[k]]
    return "; ".join(parts) or "no unadmitted workload has a usable model"


def with_standby(
    demand: Mapping[str, ModelDemand], standby: Mapping[str, str]
) -> dict[str, ModelDemand]:
    """``demand`` plus one standby replica for each model of ``standby`` it does not already
    ask for (never direct, never a preemption: see :data:`STANDBY_REASON`)."""
    out = dict(demand)
    for m in sorted(set(standby.values())):
        d = out.get(m)
        if d is not None and d.desired_replicas - d.held_replicas > 0:
            continue
        base = d or ModelDemand(model_id=m)
        out[m] = msgspec.structs.replace(
            base,
            desired_replicas=max(base.desired_replicas, STANDBY_REPLICAS),
            held_replicas=0,
            direct=False,
            reasons=(*base.reasons, STANDBY_REASON),
        )
    return out


def displaced(real: Plan, trial: Plan, standby_models: set[str]) -> list[str]:
    """Models of the real plan that the plan with standby places fewer replicas of (the
    proof that standby took nothing from real demand is an empty list)."""
    out = []
    for m in sorted({a.model_id for a in real.assignments} - standby_models):
        if len(trial.hosts_of(m)) < len(real.hosts_of(m)):
            out.append(m)
    staged_real = {(e.host_id, e.beneficiary) for e in real.evictions}
    staged_trial = {(e.host_id, e.beneficiary) for e in trial.evictions}
    out.extend(f"{b} (staged on {h})" for h, b in sorted(staged_real - staged_trial) if b)
    return out
