"""In-flight requests are demand: a model busy with long requests is not drained for a peer.

Requests feed the forecast only when they finish, so a model serving fifteen long generations
can look idle to the forecast. The engines' own in-flight counts are demand now: such a model
keeps its replica against an equal-priority model, and status says why.
"""

from __future__ import annotations

from simfleet import SimFleet, SimResidency

from grid_core.demand import RequestFeatures
from grid_core.profile import ModelProfile


def _one_slot_fleet(busy: int) -> SimFleet:
    fleet = SimFleet.uniform(1, 12_000)
    fleet.put_profile(ModelProfile(model_id="long", memory_mb=10_000, min_residency_s=0.0))
    fleet.put_profile(ModelProfile(model_id="peer", memory_mb=10_000, min_residency_s=0.0))
    fleet.nodes["h1"].residencies["long"] = SimResidency(
        "long", 10_000, "ready", active=busy, loaded_at=fleet.now - 7200.0
    )
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.now += 3600.0  # far past any cooldown of the load itself
    for i in range(20):  # the peer has fresh direct demand
        fleet.ctl.observe_request(
            RequestFeatures(
                at=fleet.now - i * 0.1,
                endpoint="chat",
                requested_model="peer",
                served_model="peer",
                service_time_s=2.0,
            )
        )
    return fleet


def _drained(fleet: SimFleet) -> bool:
    for _ in range(5):
        fleet.now += 5.0
        for cmd in fleet.heartbeat("h1"):
            if cmd.kind == "drain" and cmd.model_id == "long":
                return True
    return False


def test_in_flight_requests_count_as_demand() -> None:
    fleet = _one_slot_fleet(busy=15)
    assert not _drained(fleet)
    fc = fleet.ctl.last.forecasts["long"]
    assert fc.desired_replicas >= 1 and "in_flight" in fc.reasons and fc.direct
    assert fc.offered_concurrency >= 15
    assert fleet.violations == []


def test_an_idle_model_still_yields_its_slot() -> None:
    # The same fleet with nothing in flight: the idle model's slot goes to the peer's demand.
    fleet = _one_slot_fleet(busy=0)
    assert _drained(fleet)
