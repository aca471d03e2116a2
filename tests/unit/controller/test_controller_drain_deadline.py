"""Drain deadline: a drained replica with requests that never end is not waited on forever.

The controller defers the unload while requests are in flight, says why and until when in
status, and once the drain deadline has passed it decides explicitly: the unload is sent
with ``force`` and reason ``drain_deadline`` (issue 20; specification invariant 6, "only an
explicit force stop may cut it"). The simulated nodes record a forced unload that comes
before the deadline as a violation.
"""

from __future__ import annotations

import pytest
from simfleet import SimFleet

from grid_core.profile import ModelProfile
from grid_core.reconcile.policy import DRAIN_DEADLINE_REASON, DRAIN_DEADLINE_S

STEP_S = 10.0
LOW = ModelProfile(model_id="lo", memory_mb=8000, min_replicas=1, min_residency_s=0)


def step(fleet: SimFleet, *, drains_fail: bool = False) -> list:
    fleet.now += STEP_S
    sent = []
    for h in sorted(fleet.nodes):
        sent += fleet.heartbeat(h)
    for h in sorted(fleet.nodes):
        while fleet.nodes[h].started:
            running = next(iter(fleet.nodes[h].started.values()))
            fleet.complete(h, fail=drains_fail and running.kind == "drain")
    return sent


def deferred(fleet: SimFleet, model: str) -> list:
    report = fleet.ctl.last.report
    assert report is not None
    return [d for d in report.deferred if d.model_id == model and d.kind == "unload"]


@pytest.mark.parametrize("drains_fail", [False, True])
def test_drain_deadline_forces_the_unload_explicitly_and_status_says_why(drains_fail: bool):
    """``drains_fail``: the node's drain reports success (the route is fenced) but its process
    stays draining, the soak's kind "forced unload ... before the drain deadline" that the
    simulated node used to misjudge (it started the deadline only at a clean drain)."""
    fleet = SimFleet({"h1": 10_000})
    fleet.put_profile(LOW)
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.converge(rounds=10)
    assert fleet.nodes["h1"].residencies["lo"].state == "ready"
    fleet.run_requests("h1", "lo", 2)  # two requests that never finish
    fleet.put_profile(
        ModelProfile(model_id="hi", memory_mb=8000, min_replicas=1, priority=10, min_residency_s=0)
    )
    drained_at = None
    unloads = []
    for _ in range(int(2 * DRAIN_DEADLINE_S / STEP_S)):
        sent = step(fleet, drains_fail=drains_fail)
        lo = fleet.nodes["h1"].residencies.get("lo")
        if drained_at is None and lo is not None and lo.state == "draining":
            drained_at = fleet.now
        unloads += [c for c in sent if c.kind == "unload" and c.model_id == "lo"]
        if unloads:
            break
        if drained_at is not None and 2 * STEP_S < fleet.now - drained_at < DRAIN_DEADLINE_S:
            # Before the deadline: deferred because requests run, with the deadline as until.
            [d] = deferred(fleet, "lo")
            assert d.reason == "in_flight" and d.until is not None
            assert d.until > fleet.now
    assert drained_at is not None, "the preemption never drained the victim"
    [unload] = unloads
    assert unload.force and unload.reason == DRAIN_DEADLINE_REASON
    assert fleet.now - drained_at >= DRAIN_DEADLINE_S - 2 * STEP_S
    assert fleet.forced == [("h1", "lo", 2)]
    assert fleet.violations == []
    # The beneficiary is then served.
    fleet.converge(rounds=10)
    assert fleet.nodes["h1"].residencies["hi"].state == "ready"


def test_an_idle_drained_replica_is_unloaded_without_force():
    fleet = SimFleet({"h1": 10_000})
    fleet.put_profile(LOW)
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.converge(rounds=10)
    fleet.put_profile(
        ModelProfile(model_id="hi", memory_mb=8000, min_replicas=1, priority=10, min_residency_s=0)
    )
    unloads = []
    for _ in range(20):
        unloads += [c for c in step(fleet) if c.kind == "unload"]
    assert unloads and not any(c.force for c in unloads)
    assert fleet.forced == [] and fleet.violations == []


def test_a_draining_host_is_evacuated_make_before_break():
    """A host whose owner became active (draining) keeps its replica until the replacement on
    another host is ready; a paused host releases at once (it serves nothing either way)."""
    fleet = SimFleet({"h1": 10_000, "h2": 10_000, "h3": 10_000})
    fleet.put_profile(
        ModelProfile(
            model_id="m", memory_mb=8000, min_replicas=2, max_replicas=2, min_residency_s=0
        )
    )
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.converge(rounds=10)
    loaded = sorted(h for h, n in fleet.nodes.items() if "m" in n.residencies)
    spare = next(h for h in fleet.nodes if h not in loaded)
    active = loaded[0]
    fleet.nodes[active].lifecycle = "draining"
    released_before_ready = []
    for _ in range(20):
        fleet.now += STEP_S
        for h in sorted(fleet.nodes):
            for c in fleet.heartbeat(h):
                spare_res = fleet.nodes[spare].residencies.get("m")
                if c.node_id == active and (spare_res is None or spare_res.state != "ready"):
                    released_before_ready.append(c.kind)
        for h in sorted(fleet.nodes):
            while fleet.nodes[h].started:
                fleet.complete(h)
    assert fleet.nodes[spare].residencies["m"].state == "ready"
    assert "m" not in fleet.nodes[active].residencies  # evacuated in the end
    assert released_before_ready == []
    assert fleet.violations == []
