"""Churn regressions found on the logical fleet, replayed with the real controller + planner.

Source: specification, "Global placement loop" (the scale-down cooldown only holds replicas;
destructive preemption needs a baseline, a pin or a live direct signal).
"""

from __future__ import annotations

from simfleet import SimFleet

from grid_core.demand import RequestFeatures
from grid_core.profile import ModelProfile

COOLDOWN_S = 600.0
SERVICE_S = 2.0


def _requests(fleet: SimFleet, model_id: str, count: int) -> None:
    for i in range(count):
        fleet.ctl.observe_request(
            RequestFeatures(
                at=fleet.now - i * 0.01,
                endpoint="chat",
                requested_model=model_id,
                served_model=model_id,
                service_time_s=SERVICE_S,
            )
        )


def _burst_then_quiet() -> SimFleet:
    """general (priority 50) bursts to two replicas; coder (priority 10) holds the third host.

    Each host fits exactly one model, so once general loses a host the only way back to
    two replicas is to evict coder.
    """
    fleet = SimFleet.uniform(3, 5000)
    for h in fleet.nodes:
        fleet.heartbeat(h)
    fleet.ctl.set_mode("automatic", fleet.now)
    common = {"memory_mb": 4000, "min_residency_s": 0.0, "scale_down_cooldown_s": COOLDOWN_S}
    fleet.put_profile(
        ModelProfile(model_id="general", min_replicas=1, max_replicas=2, priority=50, **common)
    )
    fleet.put_profile(ModelProfile(model_id="coder", max_replicas=1, priority=10, **common))
    fleet.converge(rounds=3)
    _requests(fleet, "coder", 1)
    fleet.converge(rounds=3)
    for _ in range(6):  # a minute of busy traffic: two replicas' worth
        _requests(fleet, "general", 40)
        fleet.converge(rounds=1)
    fleet.converge(rounds=3)
    ready = [
        m for n in fleet.nodes.values() for m, r in n.residencies.items() if r.state == "ready"
    ]
    assert sorted(ready) == ["coder", "general", "general"], ready
    return fleet


def test_cooldown_hold_never_preempts_lower_priority_work() -> None:
    """Traffic stopped two minutes ago; general's cooldown still holds two replicas when one
    of its hosts turns unhealthy. Holding is not demand: coder is not evicted to rebuild the
    held count (the decaying forecast tail is not a live signal either).
    """
    fleet = _burst_then_quiet()
    fleet.converge(rounds=12)  # two quiet minutes, well inside general's cooldown
    lost = next(
        h
        for h, n in sorted(fleet.nodes.items())
        if "general" in n.residencies and "coder" not in n.residencies
    )
    fleet.nodes[lost].lifecycle = "unhealthy"  # e.g. its owner took the machine back
    drains: list[tuple[str, str, str]] = []
    for _ in range(8):
        fleet.now += 10.0
        for h in sorted(fleet.nodes):
            drains += [(h, c.model_id, c.reason) for c in fleet.heartbeat(h) if c.kind == "drain"]
            while fleet.nodes[h].started:
                fleet.complete(h)
    assert not [d for d in drains if d[1] == "coder"], drains
    assert not fleet.ctl.last.plan.evictions
    coder = [n.residencies.get("coder") for n in fleet.nodes.values()]
    assert any(r is not None and r.state == "ready" for r in coder)
    assert fleet.violations == []


def test_forecast_tail_is_not_live_direct_evidence() -> None:
    """Once the live window has passed, a model keeps its cooldown count but loses direct
    authority, and the replicas only the cooldown keeps are reported as held."""
    fleet = _burst_then_quiet()
    _requests(fleet, "general", 1)  # the tail of the burst
    busy = fleet.ctl.demand.forecast(
        fleet.now, fleet.ctl.profiles.values(), fleet.hosts(), fleet.plugins
    )["general"]
    assert busy.direct and busy.held_replicas == 0
    fleet.converge(rounds=6)
    quiet = fleet.ctl.demand.forecast(
        fleet.now, fleet.ctl.profiles.values(), fleet.hosts(), fleet.plugins
    )["general"]
    assert quiet.request_rate_rps > 0  # the EWMA tail is still there...
    assert not quiet.direct  # ...but it is not live evidence
    assert quiet.desired_replicas == 2 and "cooldown" in quiet.reasons
    assert quiet.held_replicas == 1  # the baseline asks for one; the cooldown holds the other


def test_in_flight_warm_is_an_incumbent_not_re_placed_elsewhere() -> None:
    """A second replica is loading on one host when another host gains cached weights.

    The planner keeps the replica the fleet is already converging to: nothing delivered is
    cancelled (the node would finish it anyway), and the model never exceeds max_replicas.
    """
    fleet = SimFleet.uniform(3, 5000)
    for h in fleet.nodes:
        fleet.heartbeat(h)
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.put_profile(
        ModelProfile(
            model_id="general",
            memory_mb=4000,
            min_replicas=1,
            max_replicas=2,
            min_residency_s=0.0,
            priority=50,
        )
    )
    fleet.converge(rounds=3)
    _requests(fleet, "general", 40)  # enough for a second replica
    fleet.now += 1.0
    loading = [h for h in sorted(fleet.nodes) for c in fleet.heartbeat(h) if c.kind == "load"]
    assert len(loading) == 1
    spare = next(h for h, n in sorted(fleet.nodes.items()) if h != loading[0] and not n.residencies)
    fleet.nodes[spare].cached.add("general")  # now a better-looking cold start
    warmed: set[str] = set()
    for _ in range(4):  # heartbeats while the load is still running
        fleet.now += 1.0
        for h in sorted(fleet.nodes):
            warmed |= {h for c in fleet.heartbeat(h) if c.kind == "warm"}
    assert warmed <= set(loading)
    assert not [w for w in fleet.ctl.last.report.withdrawals if w.model_id == "general"]
    assert not [a for a in fleet.ctl.book if a.status == "cancelled"]
    fleet.converge(rounds=3, step_s=1.0)
    ready = [h for h, n in fleet.nodes.items() if "general" in n.residencies]
    assert len(ready) == 2, ready
    assert fleet.violations == []


def _report_all(fleet: SimFleet) -> None:
    """Every node reports its inventory without polling for commands."""
    for n in fleet.nodes.values():
        n.last_report, n.last_report_at = n.snapshot(fleet.now), fleet.now
    fleet.ctl.note_input(fleet.now, safety_changed=True)


def test_returning_demand_keeps_a_replica_whose_routine_drain_is_pending() -> None:
    """A scale-down drain is issued but not yet delivered when demand comes back: the ready
    replica is kept (the drain withdrawn) instead of cold-loading a new one elsewhere."""
    fleet = SimFleet.uniform(3, 5000)
    for h in fleet.nodes:
        fleet.heartbeat(h)
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.put_profile(
        ModelProfile(
            model_id="general",
            memory_mb=4000,
            min_replicas=1,
            max_replicas=2,
            min_residency_s=0.0,
            scale_down_cooldown_s=60.0,
            priority=50,
        )
    )
    fleet.converge(rounds=2)
    for _ in range(3):
        _requests(fleet, "general", 40)
        fleet.converge(rounds=1)
    drains = []
    for _ in range(40):  # quiet until the cooldown ends and a scale-down drain is staged
        fleet.now += 10.0
        _report_all(fleet)
        fleet.tick()
        drains = [a for a in fleet.ctl.book.active() if a.kind == "drain"]
        if drains:
            break
    assert [(a.reason, a.delivered) for a in drains] == [("obsolete", False)]
    _requests(fleet, "general", 40)
    fleet.now += 1.0
    _report_all(fleet)
    fleet.tick()
    placed = {a.host_id for a in fleet.ctl.last.plan.assignments}
    assert drains[0].host_id in placed
    assert not [a for a in fleet.ctl.book.active() if a.kind in ("load", "warm")]
    assert [w.reason for w in fleet.ctl.last.report.withdrawals] == ["desired_again"]
