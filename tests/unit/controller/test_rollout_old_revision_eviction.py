"""The stateful test's kind "priority inversion: b (priority 0) evicted on h1 for a (priority
0)", found on a random seed: it was the checker's mistake, not the controller's.

Model ``b`` rolled to a new revision, which became ready on h3; its old revision still ran on
h1. When ``a`` then rolled too and needed a host, the planner released h1 by evicting the old
``b``, which is obsolete work once the new revision serves (specification, "Managed host
actuator": the old version drains after a matching replica is ready elsewhere). ``b`` lost no
service, so it is no inversion; before the new revision is ready the old one keeps its
model's priority (``tests/unit/planner/test_planner_preemption.py``).
"""

from __future__ import annotations

from fleet_strategies import ModelSpec, SimFleetSpec
from test_controller_stateful import FleetMachine


def test_priority_inversion_is_not_a_finished_rollouts_old_revision_making_room() -> None:
    m = FleetMachine()
    m.start(
        spec=SimFleetSpec(
            hosts={"h1": 10_000, "h2": 8000, "h3": 10_000},
            models={
                "a": ModelSpec(memory_mb=5000, min_replicas=1, max_replicas=1),
                "b": ModelSpec(memory_mb=5000, min_replicas=1, max_replicas=1),
            },
        )
    )
    fleet = m.fleet
    m.one_heartbeat(host="h1", order="all")
    m.revision_change(model="b", second=False)
    m.revision_change(model="b", second=True)
    m.fleet_rounds(fail=False, rounds=3)
    new_b = fleet.profiles["b"].artifact_sha256
    assert fleet.nodes["h1"].residencies["b"].sha != new_b  # the old revision, still ready
    assert fleet.nodes["h3"].residencies["b"].sha == new_b
    m.revision_change(model="a", second=False)
    m.one_heartbeat(host="h1", order="all")
    assert fleet.nodes["h1"].residencies["b"].state == "draining"
    (drain,) = [a for a in fleet.ctl.book.active() if a.kind == "drain"]
    assert (drain.host_id, drain.model_id, drain.beneficiary) == ("h1", "b", "a")
    assert fleet.violations == []
    m.fleet_rounds(fail=False, rounds=3)
    assert fleet.violations == []
    assert fleet.nodes["h3"].residencies["b"].state == "ready"  # b served throughout
    new_a = fleet.profiles["a"].artifact_sha256
    assert any(
        (r := n.residencies.get("a")) is not None and r.state == "ready" and r.sha == new_a
        for n in fleet.nodes.values()
    )
