"""The soak's kind "priority inversion: a (priority 0) evicted on h4 for b (priority 0)", when
the replica the plan kept was itself already being drained.

Planner overrides moved a from h3 to h4: the drain of a on h3 was delivered at t=50, and h3's
report of t=50 still says ready. At t=60, b (same priority, minimum one) needs a host and h1,
h2 are throttled. The first heartbeat of that round ticks before h3 reports again. The
planning view showed h3's replica as ready, so the planner kept a on h3 (ready incumbents tie;
h3 sorts first), took h4's replica as surplus and evicted it for b: both replicas of a were
then leaving. A delivered drain cannot be taken back (the node may have fenced the route
already), so the planning view now shows that replica as draining. The planner keeps a on h4
and gives b the room of the replica already leaving h3 (specification, "Global placement
loop": already-draining victims are preferred; "Safety invariants" 8).
"""

from __future__ import annotations

from fleet_strategies import ModelSpec, SimFleetSpec
from test_controller_stateful import FleetMachine

from grid_core.reconcile.control import with_in_flight


def test_a_delivered_drain_leaves_the_other_replica_kept_and_b_takes_its_room() -> None:
    m = FleetMachine()
    m.start(
        spec=SimFleetSpec(
            hosts={"h1": 10_000, "h2": 10_000, "h3": 10_000, "h4": 10_000},
            models={
                "a": ModelSpec(memory_mb=5000, min_replicas=0, max_replicas=1),
                "b": ModelSpec(memory_mb=5000, min_replicas=1, max_replicas=1),
            },
        )
    )
    m.planner_output(placement={"a": ["h3"], "b": [], "c": []})
    m.fleet_rounds(fail=False, rounds=2)
    m.host_lifecycle(host="h1", state="throttled")
    m.host_lifecycle(host="h2", state="throttled")
    m.planner_output(placement={"a": ["h4"], "b": [], "c": []})
    m.fleet_rounds(fail=False, rounds=3)  # a warms on h4; its drain on h3 is delivered
    m.planner_output(placement=None)
    fleet = m.fleet
    drains = [a for a in fleet.ctl.book if a.kind == "drain" and a.host_id == "h3"]
    assert [(a.reason, a.delivered) for a in drains] == [("obsolete", True)]
    assert fleet.nodes["h3"].last_report is not None
    assert fleet.nodes["h3"].last_report.residency("a").state == "ready"  # reported before
    view = {h.host_id: h for h in with_in_flight(fleet.hosts(), fleet.ctl.book)}
    assert view["h3"].residency("a").state == "draining"
    assert view["h4"].residency("a").state == "ready"

    fleet.now += 10.0
    fleet.heartbeat("h1")  # ticks on h3's report from before its drain was delivered
    plan = fleet.ctl.last.plan
    assert plan is not None
    assert [(x.model_id, x.host_id) for x in plan.assignments] == [("a", "h4")]
    assert [(e.model_id, e.host_id, e.beneficiary) for e in plan.evictions] == [("a", "h3", "b")]
    for h in ("h2", "h3", "h4"):
        fleet.heartbeat(h)
    assert fleet.violations == []
    fleet.converge(rounds=8)
    assert m.fleet.ready_hosts("a") == ["h4"]  # a kept its one replica throughout
    assert m.fleet.ready_hosts("b") == ["h3"]
    assert fleet.violations == []
