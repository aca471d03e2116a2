"""A preemption that takes a baseline's last ready replica relocates it make-before-break.

Issue 20, preemption scenario: a priority-100 burst takes the host of a priority-50 baseline's
only replica. When the same plan can give the baseline a replacement elsewhere (a free host
now, or a staged preemption of lower-priority work), the eviction is marked
make-before-break: reconciliation warms the replacement first and drains the victim only once
the replacement is ready, so the baseline never has zero ready replicas (specification,
"Safety invariants" 5 with 3). Without any replacement in the plan, the preemption exception
applies only when the baseline could never move.
"""

from __future__ import annotations

from planner_helpers import NOW, host, model, res, run

from grid_core.planner import Plan
from grid_core.reconcile import ActionBook, GovernorPolicy, ReconcileInputs, reconcile
from grid_core.snapshot import HostSnapshot

BASE, BATCH, BURST = "general", "coder", "writer"
PROFILES = [
    model(BASE, 6, min_replicas=1, max_replicas=1, priority=50),
    model(BATCH, 6, min_replicas=1, max_replicas=3, priority=10),
    # The burst may run only where the baseline lives (a GPU tag), so it must take that host.
    model(BURST, 6, min_replicas=1, max_replicas=1, priority=100, required_tags=("gpu",)),
]
"""One-model-per-host sizes: 6 GB replicas on 8 GB hosts."""


def _res(model_id: str, *, young: bool = False, state: str = "ready"):
    loaded = NOW - 10.0 if young else NOW - 3600.0
    return res(model_id, 6, state=state, routable=True, loaded_at=loaded)


def _fleet(*, batch_young: bool, spare: bool) -> list[HostSnapshot]:
    hosts = [
        host("h1", 8, tags=("gpu",), residencies=(_res(BASE),)),
        host("h2", 8, residencies=(_res(BATCH, young=batch_young),)),
        host("h3", 8, residencies=(_res(BATCH, young=batch_young),)),
    ]
    if spare:
        hosts.append(host("h4", 8))
    return hosts


def _eviction(p: Plan, model_id: str, host_id: str):
    [e] = [e for e in p.evictions if e.model_id == model_id and e.host_id == host_id]
    return e


def _reconcile(p: Plan, hosts: list[HostSnapshot]):
    return reconcile(
        ReconcileInputs(
            now=NOW,
            plan=p,
            hosts={h.host_id: h for h in hosts},
            profiles={q.model_id: q for q in PROFILES},
            retired=frozenset(),
            book=ActionBook(),
            policy=GovernorPolicy(),
        )
    )


def _drains(result, model_id: str) -> list[str]:
    return [p.host_id for p in result.proposals if p.kind == "drain" and p.model_id == model_id]


def test_relocation_to_a_free_host_is_make_before_break():
    hosts = _fleet(batch_young=True, spare=True)
    p = run(PROFILES, hosts)
    e = _eviction(p, BASE, "h1")
    assert e.beneficiary == BURST and e.make_before_break
    assert (BASE, "h4") in {(a.model_id, a.host_id) for a in p.assignments}
    # The replacement warms now; the victim's drain waits for it and status says why.
    first = _reconcile(p, hosts)
    assert [(x.kind, x.host_id) for x in first.proposals if x.model_id == BASE] == [("warm", "h4")]
    assert _drains(first, BASE) == []
    [why] = [d for d in first.deferred if d.model_id == BASE and d.kind == "drain"]
    assert why.reason == "replacement_not_ready"
    # Once the replacement reports ready (and routable), the victim drains.
    hosts[3] = host("h4", 8, residencies=(_res(BASE),))
    assert _drains(_reconcile(p, hosts), BASE) == ["h1"]


def test_relocation_by_a_staged_preemption_of_lower_priority_work_is_make_before_break():
    hosts = _fleet(batch_young=False, spare=False)
    p = run(PROFILES, hosts)
    e = _eviction(p, BASE, "h1")
    assert e.make_before_break
    # The baseline's replacement displaces a batch replica (priority 10 < 50) first.
    batch = [x for x in p.evictions if x.model_id == BATCH]
    assert [x.beneficiary for x in batch] == [BASE]
    result = _reconcile(p, hosts)
    assert _drains(result, BASE) == []  # the baseline keeps serving on h1
    assert _drains(result, BATCH) == [batch[0].host_id]  # room for its replacement first


def test_batch_inside_its_minimum_residency_holds_the_baseline_not_the_burst_forever():
    # No host is free and every batch replica is inside its minimum residency: the baseline
    # cannot move yet, so its replica keeps serving (the eviction waits for a replacement)
    # instead of leaving it with none ...
    hosts = _fleet(batch_young=True, spare=False)
    p = run(PROFILES, hosts)
    assert _eviction(p, BASE, "h1").make_before_break
    result = _reconcile(p, hosts)
    assert _drains(result, BASE) == []
    [why] = [d for d in result.deferred if d.model_id == BASE and d.kind == "drain"]
    assert why.reason == "replacement_missing"
    # ... and once that residency ends the baseline relocates over a batch replica.
    later = run(PROFILES, _fleet(batch_young=False, spare=False))
    assert _eviction(later, BASE, "h1").make_before_break
    assert [x.beneficiary for x in later.evictions if x.model_id == BATCH] == [BASE]


def test_a_baseline_that_could_never_move_is_still_preempted_by_a_critical_burst():
    # The other hosts hold higher-priority work: the baseline has nowhere to go now or later,
    # so the preemption exception of invariant 3 applies and the burst is not blocked.
    vip = model("vip", 6, min_replicas=2, max_replicas=2, priority=80)
    hosts = [
        host("h1", 8, tags=("gpu",), residencies=(_res(BASE),)),
        host("h2", 8, residencies=(_res("vip"),)),
        host("h3", 8, residencies=(_res("vip"),)),
    ]
    p = run([*PROFILES, vip], hosts)
    assert not _eviction(p, BASE, "h1").make_before_break
    assert _drains(_reconcile(p, hosts), BASE) == ["h1"]


def test_a_victim_with_another_ready_replica_is_not_held():
    profiles = [
        model(BASE, 6, min_replicas=1, max_replicas=2, priority=50),
        PROFILES[2],
    ]
    hosts = [
        host("h1", 8, tags=("gpu",), residencies=(_res(BASE),)),
        host("h2", 8, residencies=(_res(BASE),)),
        host("h3", 8),
    ]
    p = run(profiles, hosts)
    assert not _eviction(p, BASE, "h1").make_before_break
