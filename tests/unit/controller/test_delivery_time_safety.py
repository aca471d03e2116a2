"""Delivery-time safety: the last check before a drain uses what is registered *now*.

The tick that chose a drain may have seen a replacement that vanished while the tick ran or
while the delivery marker was being written. The final check re-reads the registry after
the marker is durable; a replacement whose route (not only its host's control record) is
near the end of its lease is no proof; the refusal is visible in status.
"""

from __future__ import annotations

import msgspec
from simfleet import SimFleet, SimResidency

from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot


def _fleet_with_a_surplus_replica() -> SimFleet:
    """Model ``a`` (min 1) ready on h1 and h2; the plan keeps h2, so h1 is to drain."""
    fleet = SimFleet.uniform(2, 16_000)
    fleet.override = {"a": ["h2"]}
    fleet.put_profile(
        ModelProfile(model_id="a", memory_mb=4000, min_replicas=1, min_residency_s=0.0)
    )
    fleet.nodes["h1"].residencies["a"] = SimResidency("a", 4000, "ready")
    fleet.nodes["h2"].residencies["a"] = SimResidency("a", 4000, "ready")
    for h in fleet.nodes:
        fleet.heartbeat(h, tick=False)
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.ctl.tick(fleet.now, fleet.hosts())
    assert [a.kind for a in fleet.ctl.book.active()] == ["drain"]
    return fleet


def test_stale_snapshot_race_cannot_send_a_drain() -> None:
    fleet = _fleet_with_a_surplus_replica()
    ctl = fleet.ctl
    stale = fleet.hosts()  # what the tick saw: the replacement on h2 is ready
    # While the tick ran and the marker was written, h2's replica died and h2 re-registered
    # without it. The final re-read happens after the marker is durable.
    del fleet.nodes["h2"].residencies["a"]
    fleet.nodes["h2"].last_report = fleet.nodes["h2"].snapshot(fleet.now)
    reads: list[str] = []

    def registry_now() -> tuple[float, list[HostSnapshot]]:
        (drain,) = ctl.book.active()
        reads.append("marked" if drain.delivered_at is not None else "unmarked")
        return fleet.now, fleet.hosts()

    d = ctl.deliver("h1", fleet.now, stale, ctl.revisions.dirty, fresh_hosts=registry_now)
    assert d.commands == ()  # no drain of the last ready replica
    assert reads == ["marked"]  # the registry was re-read after the marker was written
    (drain,) = ctl.book.active()
    assert drain.delivered_at is None  # the prepared marker was removed durably
    status = ctl.status(fleet.now)
    assert status.delivery_refusals == [f"{drain.action_id}: replacement_not_ready"]
    assert fleet.durable_state() is not None
    assert all(a.delivered_at is None for a in fleet.durable_state().actions)

    # The same poll with a registry that still shows the replacement delivers the drain.
    fleet.nodes["h2"].residencies["a"] = SimResidency("a", 4000, "ready")
    fleet.nodes["h2"].last_report = fleet.nodes["h2"].snapshot(fleet.now)
    (cmd,) = ctl.deliver(
        "h1", fleet.now, stale, ctl.revisions.dirty, fresh_hosts=lambda: (fleet.now, fleet.hosts())
    ).commands
    assert cmd.kind == "drain" and cmd.action_id == drain.action_id


def test_a_replacement_route_with_a_short_lease_of_its_own_is_no_proof() -> None:
    fleet = _fleet_with_a_surplus_replica()
    ctl = fleet.ctl
    # h2's control record is fresh, but the engine route that corroborates its replica last
    # refreshed 31 s ago: 29 s of its 60 s lease left, inside the 30 s margin.
    h2 = fleet.nodes["h2"].snapshot(fleet.now)
    short = msgspec.structs.replace(
        h2,
        residencies=tuple(msgspec.structs.replace(r, route_age_s=31.0) for r in h2.residencies),
    )

    def registry_now() -> tuple[float, list[HostSnapshot]]:
        return fleet.now, [fleet.nodes["h1"].snapshot(fleet.now), short]

    d = ctl.deliver("h1", fleet.now, fleet.hosts(), ctl.revisions.dirty, fresh_hosts=registry_now)
    assert d.commands == ()
    assert ctl.status(fleet.now).delivery_refusals[-1].endswith("replacement_lease_short")
