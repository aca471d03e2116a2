"""The soak's kind "priority inversion: b (priority 0) evicted on h2 for a (priority 0)", when
the eviction was staged while a still had a higher priority.

b serves on h1. The operator gives a priority 1 and a minimum of two: h2's heartbeat ticks,
the plan places a on h2 and stages the eviction of b on h1 for a's second replica. Before h1
polls for that drain, the operator puts a back to priority 0 with no minimum. The next plan no
longer stages the eviction, yet the drain stayed active and h1 received it: b was drained for
a model that no longer outranks it or needs the room. An eviction drain that the latest plan
no longer stages and that was never delivered is now cancelled (specification, "Global
placement loop": staged preemption is the plan's decision; "Safety invariants" 8).
"""

from __future__ import annotations

from fleet_strategies import ModelSpec, SimFleetSpec
from test_controller_stateful import FleetMachine


def test_an_eviction_the_plan_no_longer_stages_is_cancelled_before_delivery() -> None:
    m = FleetMachine()
    m.start(
        spec=SimFleetSpec(
            hosts={"h1": 10_000, "h2": 10_000},
            models={
                "a": ModelSpec(memory_mb=5000, min_replicas=0, max_replicas=1),
                "b": ModelSpec(memory_mb=5000, min_replicas=0, max_replicas=1),
            },
        )
    )
    m.profile_change(extra=0, lo=1, model="b", prio=0, remove=False)
    m.fleet_rounds(fail=False, rounds=2)
    fleet = m.fleet
    assert "b" in fleet.nodes["h1"].residencies
    fleet.now += 30.0  # past b's minimum residency
    m.profile_change(extra=0, lo=2, model="a", prio=1, remove=False)
    fleet.now += 10.0
    fleet.heartbeat("h2")
    plan = fleet.ctl.last.plan
    assert plan is not None
    assert [(e.model_id, e.host_id, e.beneficiary) for e in plan.evictions] == [("b", "h1", "a")]
    drain = next(a for a in fleet.ctl.book.active() if a.kind == "drain")
    assert (drain.host_id, drain.model_id, drain.delivered) == ("h1", "b", False)

    m.profile_change(extra=0, lo=0, model="a", prio=0, remove=False)
    fleet.now += 10.0
    commands = fleet.heartbeat("h1")
    assert [(c.kind, c.model_id) for c in commands] == []
    assert drain.status == "cancelled"
    fleet.converge(rounds=5)
    assert fleet.nodes["h1"].residencies["b"].state == "ready"
    assert not [a for a in fleet.ctl.book if a.kind == "drain" and a.model_id == "b"][1:]
    assert fleet.violations == []
