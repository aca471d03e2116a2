"""Surplus replicas left by an expired burst yield to direct demand for a cold model (issue 16).

Three hosts each hold one replica of a priority-50 baseline after a burst; a priority-10 model
nobody runs yet is asked for by name. Replicas the baseline keeps only for hysteresis are idle,
reclaimable victims once past their minimum residency; the baseline's needed replicas, its last
ready replica, pinned replicas, busy replicas and fresh ones are not. Status (``Plan.surplus``)
says why each surplus replica was reclaimed or kept.
"""

from __future__ import annotations

from planner_helpers import NOW, codes, demand, host, model, placed, res, run

from grid_core.demand.types import ModelDemand
from grid_core.planner.reclaim import surplus_release_s

BASE, COLD = "base", "cold"


def fleet(**residency: object) -> list:
    """Three one-replica hosts (no room for a second model) each holding a baseline replica."""
    return [
        host(f"h{i}", 6, failure_domain=f"fd-{i}", residencies=(res(BASE, 4, **residency),))
        for i in (1, 2, 3)
    ]


def profiles(**base: object) -> list:
    fields: dict[str, object] = {"priority": 50, "min_replicas": 1, "max_replicas": 3}
    fields.update(base)
    return [model(BASE, 4, **fields), model(COLD, 4, priority=10, max_replicas=1)]


def after_burst(held: int = 2, desired: int = 3) -> ModelDemand:
    """The baseline once its burst is no longer live: the cooldown holds ``held`` replicas."""
    return demand(BASE, desired, direct=False, held_replicas=held)


def reclaimed(p) -> list[tuple[str, str, str | None]]:
    return [(e.model_id, e.host_id, e.beneficiary) for e in p.evictions if e.reason == "surplus"]


def test_held_surplus_is_reclaimed_for_a_cold_models_direct_demand():
    p = run(profiles(), fleet(), [after_burst(), demand(COLD, 1)])
    assert len(reclaimed(p)) == 1
    assert reclaimed(p)[0][2] == COLD
    assert codes(p, COLD) == ["preemption_staged"]
    # The other two stay; the plan says why each surplus replica went or stayed (one cold
    # model needs one host: nobody else claims the remaining surplus).
    assert len([a for a in p.assignments if a.model_id == BASE]) == 2
    decisions = sorted((s.decision, s.reason) for s in p.surplus)
    assert decisions == [
        ("kept", "no_claimant"),
        ("kept", "no_claimant"),
        ("reclaimed", "direct_demand"),
    ]


def test_one_cold_model_takes_one_surplus_replica_not_more():
    p = run(profiles(), fleet(), [after_burst(), demand(COLD, 1)])
    assert len(p.evictions) == 1


def test_needed_replicas_of_a_live_burst_are_not_taken():
    live = demand(BASE, 3, direct=True)  # the burst is still live: all three are needed
    p = run(profiles(), fleet(), [live, demand(COLD, 1)])
    assert p.evictions == ()
    assert codes(p, COLD) == ["capacity_shortage"]
    assert p.surplus == ()


def test_surplus_inside_its_minimum_residency_is_kept_and_says_so():
    fresh = fleet(loaded_at=NOW - 5.0)
    p = run(profiles(min_residency_s=15.0), fresh, [after_burst(), demand(COLD, 1)])
    assert p.evictions == ()
    assert {(s.decision, s.reason) for s in p.surplus} == {("kept", "min_residency")}


def test_busy_surplus_is_kept():
    p = run(profiles(), fleet(active_requests=2), [after_burst(), demand(COLD, 1)])
    assert p.evictions == ()
    assert {s.reason for s in p.surplus} == {"in_flight"}


def test_a_surplus_replica_with_unknown_activity_is_kept():
    p = run(profiles(), fleet(active_requests=None), [after_burst(), demand(COLD, 1)])
    assert p.evictions == ()
    assert {s.reason for s in p.surplus} == {"activity_unknown"}


def test_no_claimant_keeps_the_surplus_as_hysteresis():
    p = run(profiles(), fleet(), [after_burst()])
    assert p.evictions == ()
    assert len(placed(p)) == 3
    assert {(s.decision, s.reason) for s in p.surplus} == {("kept", "no_claimant")}


def test_the_last_ready_replica_is_never_surplus():
    hosts = fleet()
    # Only h1's replica is ready; the others are still warming.
    hosts[1] = host("h2", 6, failure_domain="fd-2", residencies=(res(BASE, 4, state="warming"),))
    hosts[2] = host("h3", 6, failure_domain="fd-3", residencies=(res(BASE, 4, state="warming"),))
    p = run(profiles(), hosts, [after_burst(), demand(COLD, 1)])
    assert ("base", "h1") not in {(e.model_id, e.host_id) for e in p.evictions}
    assert ("kept", "last_ready_replica") in {(s.decision, s.reason) for s in p.surplus}


def test_a_pinned_surplus_replica_is_kept():
    p = run(
        profiles(pins=("h1", "h2", "h3")),
        fleet(),
        [after_burst(), demand(COLD, 1)],
    )
    assert p.evictions == ()


def test_baseline_replicas_are_never_surplus():
    p = run(profiles(min_replicas=3), fleet(), [after_burst(), demand(COLD, 1)])
    assert p.evictions == ()


def test_without_direct_demand_a_cold_model_takes_nothing():
    quiet = demand(COLD, 1, direct=False)  # only hysteresis of its own asks for it
    p = run(profiles(), fleet(), [after_burst(), quiet])
    assert p.evictions == ()


def test_held_replicas_are_never_placed_anew():
    # Only one baseline replica exists: the two the cooldown holds are not rebuilt.
    hosts = [host(f"h{i}", 6, failure_domain=f"fd-{i}") for i in (1, 2, 3)]
    hosts[0] = host("h1", 6, failure_domain="fd-1", residencies=(res(BASE, 4),))
    p = run(profiles(), hosts, [after_burst()])
    assert placed(p) == {(BASE, "h1")}
    assert codes(p, BASE) == []


def test_a_higher_priority_model_also_prefers_surplus_over_needed_work():
    hosts = fleet()
    hosts[0] = host("h1", 6, failure_domain="fd-1", residencies=(res("other", 4),))
    other = model("other", 4, priority=20, min_replicas=1)
    vip = model("vip", 4, priority=90, max_replicas=1)
    base_live = demand(BASE, 2, direct=False, held_replicas=1)
    p = run(
        [*profiles(), other, vip],
        hosts,
        [base_live, demand("vip", 1), demand("other", 1)],
    )
    assert [(e.model_id, e.reason) for e in p.evictions] == [(BASE, "surplus")]


# --- when a cold model can expect a host (Retry-After) -------------------------------------


def test_release_waits_for_live_evidence_and_minimum_residency():
    base, cold = profiles(min_residency_s=15.0)
    hosts = fleet(loaded_at=NOW - 10.0)  # 5 s of residency left
    live = {BASE: demand(BASE, 3, direct=True, live_until=NOW + 8.0)}
    got = surplus_release_s(cold, {BASE: base, COLD: cold}, live, hosts, NOW)
    assert got == 8.0
    quiet = {BASE: after_burst()}
    assert surplus_release_s(cold, {BASE: base, COLD: cold}, quiet, hosts, NOW) == 5.0


def test_release_is_none_when_only_baseline_replicas_hold_the_hosts():
    base, cold = profiles(min_replicas=3)
    got = surplus_release_s(cold, {BASE: base, COLD: cold}, {}, fleet(), NOW)
    assert got is None


def test_a_replica_already_held_is_free_once_its_residency_ends():
    base, cold = profiles(min_residency_s=15.0)
    hosts = fleet(loaded_at=NOW - 10.0)
    live_but_held = {BASE: demand(BASE, 3, held_replicas=1, live_until=NOW + 8.0)}
    got = surplus_release_s(cold, {BASE: base, COLD: cold}, live_but_held, hosts, NOW)
    assert got == 5.0  # two replicas are needed, the third only held: no wait for the window
