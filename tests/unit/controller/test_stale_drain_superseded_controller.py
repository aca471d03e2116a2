"""The soak's kind "duplicate drain of a on h2", reached through a superseded controller.

A controller instance that another one replaced (it lingers, on a stale view of the fleet)
must not get a drain it decided earlier *executed*: not on a host whose report it never saw,
not under a lease the store no longer gives it, and not on a residency that is no longer
serving when the command arrives (the node refuses it and says why). Specification, "Local
wire contract" (single-writer lease and term; the final destructive check) and "Managed host
actuator" (the node's own admission).
"""

from __future__ import annotations

from fleet_strategies import ModelSpec, SimFleetSpec
from simfleet import SimFleet, SimResidency
from test_controller_stateful import FleetMachine

from grid_core.controller import Controller
from grid_core.profile import ModelProfile


def _shrunk_soak_trace() -> FleetMachine:
    """The soak's shrunk counter-example, up to the controller restart."""
    m = FleetMachine()
    m.start(
        spec=SimFleetSpec(
            hosts={"h1": 10_000, "h2": 10_000},
            models={"a": ModelSpec(memory_mb=5000, min_replicas=0, max_replicas=1)},
        )
    )
    m.planner_crowds_one_host(host="h2")
    m.fleet_rounds(fail=False, rounds=2)
    m.planner_crowds_one_host(host="h1")
    m.fleet_rounds(fail=False, rounds=2)
    m.host_lost_or_back(host="h2", up=False)
    m.engine_dies(host="h2", model="a")
    m.fleet_rounds(fail=False, rounds=1)
    return m


def test_duplicate_drain_through_a_superseded_controller_is_never_executed() -> None:
    m = _shrunk_soak_trace()
    fleet = m.fleet
    (drain,) = fleet.ctl.book.active()  # decided on h2's last report, before it was lost
    assert (drain.kind, drain.host_id, drain.model_id) == ("drain", "h2", "a")
    m.restart_controller(keep_zombie=True, zombie_sends_to="h2")
    assert fleet.violations == []  # h2 is down: no heartbeat, so nothing can reach it
    # h2 comes back without its engine; the lingering instance answers its heartbeat first.
    m.host_lost_or_back(host="h2", up=True)
    m.superseded_controller_sends(host="h2")
    # The instance that still held the drain saw h2's fresh report and dropped it, saying why.
    (zombie,) = fleet.zombies
    dropped = zombie.book.get(drain.action_id)
    assert (dropped.status, dropped.message) == ("cancelled", "not_serving")
    m.fleet_rounds(fail=False, rounds=3)
    m.superseded_controller_sends(host="h2")
    assert fleet.violations == []
    assert fleet.refused == []  # nothing stale even reached the node
    assert "a" not in fleet.nodes["h2"].residencies


def _relocation() -> SimFleet:
    """Model ``a`` ready on h1; the plan moves it to h2, so once h2 is ready h1 drains."""
    fleet = SimFleet.uniform(2, 16_000)
    fleet.override = {"a": ["h2"]}
    fleet.put_profile(
        ModelProfile(model_id="a", memory_mb=4000, min_replicas=1, min_residency_s=0.0)
    )
    fleet.nodes["h1"].residencies["a"] = SimResidency("a", 4000, "ready")
    fleet.ctl.set_mode("automatic", fleet.now)
    for _ in range(6):
        fleet.now += 10.0
        fleet.heartbeat("h2")
        while fleet.nodes["h2"].started:
            fleet.complete("h2")
    assert fleet.nodes["h2"].residencies["a"].state == "ready"
    return fleet


def test_a_drain_whose_engine_died_in_flight_is_refused_by_the_node() -> None:
    fleet = _relocation()
    fleet.now += 10.0
    # h1 reports a ready; the drain decided on that report is in the response, but the
    # engine is killed before the response arrives.
    commands = fleet.heartbeat("h1", dies_in_flight="a")
    assert [c.kind for c in commands] == ["drain"]
    assert fleet.violations == []
    assert fleet.refused == [
        ("h1", "drain", "a", "drain of a refused: no a engine runs on this host")
    ]
    (drain,) = commands
    fleet.converge(rounds=3)
    assert fleet.ctl.book.get(drain.action_id).status == "rejected"
    assert fleet.violations == []
    assert fleet.nodes["h2"].residencies["a"].state == "ready"  # service never interrupted


def test_a_controller_that_lost_its_lease_hands_out_no_destructive_command() -> None:
    fleet = _relocation()
    old = fleet.ctl
    fleet.now += 10.0
    h1 = fleet.nodes["h1"]
    h1.last_report, h1.last_report_at = h1.snapshot(fleet.now), fleet.now  # h1's heartbeat
    old.note_input(fleet.now, safety_changed=True)
    poll = old.revisions.dirty
    old.tick(fleet.now, fleet.hosts())
    first = old.deliver("h1", fleet.now, fleet.hosts(), poll)
    assert [c.kind for c in first.commands] == ["drain"]  # marked delivered; response lost
    # The old instance is taken for dead and a successor takes the lease (term + 1), while
    # the old one still runs inside the fresh half of the lease it renewed a moment ago.
    fleet.store.dead.add(old.authority.controller_id)
    new = Controller(plugins=fleet.plugins, store=fleet.store, plan_fn=fleet.plan_fn).restore()
    new.set_mode("automatic", fleet.now + 1.0)
    assert new.authority.term == old.authority.term + 1
    again = old.deliver("h1", fleet.now + 2.0, fleet.hosts(), poll)
    assert again.commands == () and again.lease_ttl_s == 0.0
    assert old.authority.state.startswith("lost:")
    # Availability work is not what this guards; the node never saw the old term's drain.
    assert fleet.nodes["h1"].residencies["a"].state == "ready"
