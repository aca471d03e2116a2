"""The soak's kind "priority inversion: a (priority 0) evicted on h3 for b (priority 0)", when
the evicted replica is surplus.

a runs on h2 and h3 after its minimum was two; the operator lowers it to at most one replica
and gives b (same priority) a minimum of one. h1 is throttled and offers too little memory for
b, so b needs the room of a's surplus replica: the plan keeps a on h2 and evicts its replica on
h3 for b. a loses no service the profile asks for (specification, "Global placement loop":
surplus work is released before anything wanted; "Safety invariants" 8 protects served, wanted
work from lower- or equal-priority work). The checker calls an equal-priority eviction an
inversion only when the victim model is left short.
"""

from __future__ import annotations

from fleet_strategies import ModelSpec, SimFleetSpec
from test_controller_stateful import FleetMachine


def test_an_equal_priority_model_may_take_the_room_of_a_surplus_replica() -> None:
    m = FleetMachine()
    m.start(
        spec=SimFleetSpec(
            hosts={"h1": 10_000, "h2": 10_000, "h3": 10_000},
            models={
                "a": ModelSpec(memory_mb=5000, min_replicas=0, max_replicas=1),
                "b": ModelSpec(memory_mb=5000, min_replicas=0, max_replicas=1),
            },
        )
    )
    m.host_lifecycle(host="h1", state="throttled")
    m.profile_change(extra=0, lo=2, model="a", prio=0, remove=False)
    m.fleet_rounds(fail=False, rounds=2)
    assert m.fleet.ready_hosts("a") == ["h2", "h3"]
    m.profile_change(extra=0, lo=0, model="a", prio=0, remove=False)  # a: at most one
    m.profile_change(extra=0, lo=1, model="b", prio=0, remove=False)
    m.one_heartbeat(host="h3", order="all")
    plan = m.fleet.ctl.last.plan
    assert plan is not None
    assert [(e.model_id, e.host_id, e.beneficiary) for e in plan.evictions] == [("a", "h3", "b")]
    assert m.fleet.violations == []
    m.fleet.converge(rounds=8)
    assert m.fleet.ready_hosts("a") == ["h2"]  # a kept its one wanted replica throughout
    assert m.fleet.ready_hosts("b") == ["h3"]
    assert m.fleet.violations == []


def test_a_rollout_may_take_the_second_replica_of_an_equal_priority_model() -> None:
    """Max-min fairness within a class (the make test stateful run's shrunk trace): b rolls to
    a new revision that has no ready replica yet; the only room is a's second replica on h4,
    while a keeps one on h2. Taking it serves b's first replica before a's second."""
    m = FleetMachine()
    m.start(
        spec=SimFleetSpec(
            hosts={"h1": 10_000, "h2": 12_000, "h3": 10_000, "h4": 10_000},
            models={
                "a": ModelSpec(memory_mb=5000, min_replicas=1, max_replicas=2),
                "b": ModelSpec(memory_mb=5000, min_replicas=1, max_replicas=1),
                "c": ModelSpec(memory_mb=5000, min_replicas=0, max_replicas=1),
            },
        )
    )
    m.host_lifecycle(host="h1", state="throttled")
    m.host_lifecycle(host="h3", state="throttled")
    m.fleet_rounds(fail=True, rounds=3)
    m.revision_change(model="b", second=False)
    m.fleet_rounds(fail=False, rounds=2)
    assert m.fleet.ready_hosts("a") == ["h2"]  # a keeps a replica throughout
    evicted = [(a.model_id, a.host_id, a.beneficiary) for a in m.fleet.ctl.book if a.eviction]
    assert ("a", "h4", "b") in evicted
    assert m.fleet.violations == []
    m.fleet.converge(rounds=10)
    assert m.fleet.ready_hosts("a") and m.fleet.ready_hosts("b")
    assert m.fleet.violations == []


def test_a_minimum_comes_before_another_models_extra_replica() -> None:
    """Floors before extras (a soak trace): b's operator-set minimum rises to two on a
    two-host fleet where a (minimum one) holds both hosts; a's second replica makes room for
    b's second while a keeps its one."""
    m = FleetMachine()
    m.start(
        spec=SimFleetSpec(
            hosts={"h1": 10_000, "h2": 12_000},
            models={
                "a": ModelSpec(memory_mb=5000, min_replicas=1, max_replicas=2),
                "b": ModelSpec(memory_mb=5000, min_replicas=0, max_replicas=1),
            },
        )
    )
    m.one_heartbeat(host="h1", order="all")
    for _ in range(6):
        m.engine_dies(host="h1", model="a")
    m.profile_change(extra=0, lo=2, model="b", prio=0, remove=False)
    m.fleet_rounds(fail=False, rounds=3)
    assert m.fleet.ready_hosts("a")  # a keeps its minimum throughout
    assert m.fleet.violations == []
    m.fleet.converge(rounds=10)
    assert len(m.fleet.ready_hosts("a")) >= 1 and len(m.fleet.ready_hosts("b")) == 2
    assert m.fleet.violations == []
