"""The soak's kind "drain of the last ready replica of required a on h1", when the replacement
is lost between its report and the drain: its engine dies, or its host stops accepting.

A move of a required model's only replica from h1 to h3 warms h3 first and drains h1 only
once h3's report shows the replacement ready, routable and inside its lease (specification,
"Global placement loop": make before break; "Local wire contract": the final destructive
check). If h3's engine is killed after that report and before h1's next heartbeat, no
controller can know: the drain is decided on valid evidence and the model has no ready
replica until h3's next report shows the loss and the controller warms a new one. The soak
counts these drains apart (``SimFleet.unobservable``); a drain without such evidence is still
a violation. The same holds when the replacement's host is paused by its owner after its last
report: the replica no longer serves, and the controller learns it at that host's next
heartbeat.
"""

from __future__ import annotations

import pytest
from fleet_strategies import ModelSpec, SimFleetSpec
from test_controller_stateful import FleetMachine

from grid_core.wire import Command


def _moved_to_h3() -> FleetMachine:
    """The soak's shrunk trace: a moves from h1 to h3 and h3 has reported it ready."""
    m = FleetMachine()
    m.start(
        spec=SimFleetSpec(
            hosts={"h1": 10_000, "h2": 10_000, "h3": 10_000},
            models={"a": ModelSpec(memory_mb=5000, min_replicas=1, max_replicas=1)},
        )
    )
    m.fleet_rounds(fail=False, rounds=1)
    m.planner_output(placement={"a": ["h3"], "b": [], "c": []})
    m.fleet_rounds(fail=False, rounds=3)
    return m


@pytest.mark.parametrize("in_flight", [False, True])
def test_a_replacement_that_dies_unreported_is_counted_and_the_model_recovers(
    in_flight: bool,
) -> None:
    m = _moved_to_h3()
    assert m.fleet.ready_hosts("a") == ["h1", "h3"]  # made before break
    if in_flight:
        m.engine_dies_in_flight(host="h3", model="a")
    else:
        m.engine_dies(host="h3", model="a")
    m.fleet_rounds(fail=False, rounds=1)
    # h1's heartbeat came first: its drain was decided on h3's valid report of a ready a.
    assert m.fleet.unobservable == [("h1", "h3", "a")]
    assert m.fleet.violations == []
    m.fleet.converge(rounds=6)
    assert len(m.fleet.ready_hosts("a")) == 1  # the loss was reported and a replacement warmed
    assert m.fleet.violations == []


def test_a_drain_without_a_ready_replacement_in_any_report_is_still_a_violation() -> None:
    """The checker's allowance covers only evidence the controller really had."""
    m = _moved_to_h3()
    fleet = m.fleet
    h3 = fleet.nodes["h3"]
    h3.residencies.pop("a")
    h3.last_report = h3.snapshot(fleet.now)  # the loss is reported ...
    h1 = fleet.nodes["h1"]
    fleet.receive(h1, [_drain(m, "h1", "a")], 30.0)  # ... and a drain arrives anyway
    assert fleet.violations == ["drain of the last ready replica of required a on h1"]
    assert fleet.unobservable == []


def _drain(m: FleetMachine, host_id: str, model_id: str) -> Command:
    """A drain of ``model_id`` on ``host_id`` under the current controller's authority."""
    fleet = m.fleet
    return Command(
        action_id="drain-test",
        kind="drain",
        node_id=host_id,
        model_id=model_id,
        plan_generation="g-test",
        controller_term=fleet.ctl.authority.term,
        controller_id=fleet.ctl.authority.controller_id,
        controller_lease_expires_at=fleet.now + 30.0,
        executable=True,
        reason="relocation",
        created_at=fleet.now,
        not_before=fleet.now,
    )


def test_a_replacement_host_paused_unreported_is_counted_and_the_model_recovers() -> None:
    """The soak's shrunk trace: the planner crowds both models onto h2, b (required) is made
    ready there, h2's owner pauses it, and before h2 reports that, h1's heartbeat carries the
    drain of b that h2's last report justified."""
    m = FleetMachine()
    m.start(
        spec=SimFleetSpec(
            hosts={"h1": 10_000, "h2": 10_000},
            models={
                "a": ModelSpec(memory_mb=5000, min_replicas=0, max_replicas=1),
                "b": ModelSpec(memory_mb=5000, min_replicas=1, max_replicas=1),
            },
        )
    )
    m.planner_crowds_one_host(host="h1")
    m.fleet_rounds(fail=False, rounds=3)
    m.planner_crowds_one_host(host="h2")
    m.superseded_controller_sends(host="h1")
    m.fleet_rounds(fail=False, rounds=2)
    fleet = m.fleet
    assert fleet.ready_hosts("b") == ["h1", "h2"]  # made before break
    m.host_lifecycle(host="h2", state="paused")
    m.engine_dies_in_flight(host="h1", model="a")
    assert fleet.unobservable == [("h1", "h2", "b")]
    assert fleet.violations == []
    assert fleet.nodes["h1"].residencies["b"].state == "draining"
    fleet.override = None  # the real planner again
    fleet.converge(rounds=8)
    # h2's report of the pause reached the controller: b is warmed again where it can serve.
    assert fleet.ready_hosts("b") == ["h1"]
    assert fleet.violations == []
