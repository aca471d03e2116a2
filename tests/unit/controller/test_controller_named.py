"""The controller behaviours an operator relies on, each as one named scenario."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from simfleet import DurableMemoryStore, SimFleet, SimResidency

from grid_core.controller import Controller
from grid_core.errors import ConflictError
from grid_core.planner.types import Assignment, Plan
from grid_core.profile import ModelProfile
from grid_core.store import MemoryStore
from grid_core.testing import plugins_with
from grid_core.wire import Acknowledgement
from grid_server.store import FileStateStore

NOW = 1_000_000.0


def _fixed_plan(placement: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    """A planner stand-in that wants ``model -> hosts`` whatever the inputs."""

    def plan_fn(inputs, plugins):  # type: ignore[no-untyped-def]
        mem = {p.model_id: p.memory_mb for p in inputs.profiles}
        assigned = tuple(
            Assignment(
                model_id=m,
                host_id=h,
                incumbent=False,
                runtime="llama.cpp",
                memory_mb=mem[m],
                reason="score",
            )
            for m, hosts in sorted(placement.items())
            if m in mem
            for h in hosts
        )
        return Plan(
            assignments=assigned,
            desired={m: len(h) for m, h in placement.items() if m in mem},
            digest="fixed",
        )

    return plan_fn


# --- durable state ------------------------------------------------------------------------
def test_restart_with_corrupt_state_file_quarantines_it_and_starts_clean(tmp_path: Path) -> None:
    state = tmp_path / "controller.json"
    first = Controller(plugins=plugins_with(), store=FileStateStore(state)).restore()
    first.put_profile(ModelProfile(model_id="a", memory_mb=1000), NOW)
    assert state.exists()
    state.write_bytes(b'{"schema": "grid-controller-state/1", "epoch": 7, "profiles": [')

    ctl = Controller(plugins=plugins_with(), store=FileStateStore(state)).restore()

    status = ctl.status(NOW, detail=True)
    assert status.mode == "recommend"
    assert status.profiles == []  # nothing half-restored from the broken document
    assert status.state_warning is not None and "started clean" in status.state_warning
    moved = [
        p
        for p in tmp_path.iterdir()
        if p.name.startswith("controller.json.corrupt-") and not p.name.endswith(".reason")
    ]
    assert len(moved) == 1 and moved[0].read_bytes().endswith(b'"profiles": [')
    assert str(moved[0]) in (status.state_warning or "")
    # The status is plain JSON for the HTTP layer, warning included.
    assert b"state_warning" in msgspec.json.encode(status)
    # Quarantine worked, so the clean controller may still be made automatic.
    ctl.set_mode("automatic", NOW)
    assert ctl.status(NOW).mode == "automatic"


def test_corrupt_state_that_cannot_be_quarantined_refuses_automatic() -> None:
    class Stuck(DurableMemoryStore):
        def load(self) -> bytes | None:
            return b"not json"

        def quarantine(self, reason: str) -> str:
            from grid_core.errors import StateError

            raise StateError("read-only filesystem")

    ctl = Controller(plugins=plugins_with(), store=Stuck()).restore()
    with pytest.raises(ConflictError, match="automatic mode refused"):
        ctl.set_mode("automatic", NOW)
    status = ctl.status(NOW)
    assert status.mode == "recommend"
    assert status.automatic_refusal and "read-only filesystem" in status.automatic_refusal


def test_automatic_mode_is_refused_without_a_durable_state_path() -> None:
    ctl = Controller(plugins=plugins_with(), store=MemoryStore()).restore()
    with pytest.raises(ConflictError, match="durable state path"):
        ctl.set_mode("automatic", NOW)
    status = ctl.status(NOW)
    assert status.mode == "recommend"
    assert status.authority == "none"
    assert "durable" in (status.automatic_refusal or "")
    ctl.set_mode("observe", NOW)  # the other modes stay available
    assert ctl.mode == "observe"


def test_automatic_mode_is_refused_when_the_state_path_is_unwritable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the state directory should be")
    ctl = Controller(
        plugins=plugins_with(), store=FileStateStore(blocker / "controller.json")
    ).restore()
    with pytest.raises(ConflictError, match="automatic mode refused"):
        ctl.set_mode("automatic", NOW)
    assert ctl.mode == "recommend"


# --- control-plane hiccup -----------------------------------------------------------------
def _converged_fleet() -> SimFleet:
    fleet = SimFleet.uniform(4, 16_000)
    for h in fleet.nodes:
        fleet.heartbeat(h)
    fleet.put_profile(ModelProfile(model_id="a", memory_mb=6000, min_replicas=2, max_replicas=2))
    fleet.put_profile(ModelProfile(model_id="b", memory_mb=6000, min_replicas=1, max_replicas=1))
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.converge(rounds=12)
    assert fleet.violations == []
    assert fleet.ctl.book.active() == []
    return fleet


def _inventory(fleet: SimFleet) -> dict[str, dict[str, str]]:
    return {h: {m: r.state for m, r in n.residencies.items()} for h, n in fleet.nodes.items()}


@pytest.mark.parametrize("missing", ["stale", "absent", "all_but_one"])
def test_one_tick_without_any_heartbeat_unloads_nothing_and_reschedules_nothing(
    missing: str,
) -> None:
    fleet = _converged_fleet()
    before = _inventory(fleet)
    ready_before = sum(s == "ready" for h in before.values() for s in h.values())
    assert ready_before == 3

    # Every heartbeat is missing for one tick: either old (stale) or gone from the registry.
    fleet.now += 120.0
    if missing == "all_but_one":
        # The one host still heartbeating is the emptiest: the natural place to reschedule to.
        spare = min(fleet.nodes, key=lambda h: fleet.nodes[h].held_mb())
        fleet.nodes[spare].last_report = fleet.nodes[spare].snapshot(fleet.now)
        fleet.nodes[spare].last_report_at = fleet.now
    hosts = [] if missing == "absent" else fleet.hosts()
    result = fleet.ctl.tick(fleet.now, hosts)
    assert result.issued == ()
    assert result.reconciliation.hold == "membership_hiccup"
    assert fleet.ctl.book.active() == []

    # The fleet comes back (every host reports before the next tick); nothing is moved,
    # drained or unloaded. (A tick between two returning heartbeats sees the others still
    # stale and may legitimately start a make-before-break replacement where room exists.)
    for h in fleet.nodes:
        fleet.heartbeat(h, tick=False)
    fleet.converge(rounds=4)
    assert _inventory(fleet) == before
    assert [a for a in fleet.ctl.book if a.created_at >= fleet.now - 200] == []
    assert fleet.violations == []


# --- late receipts ------------------------------------------------------------------------
def test_late_success_completes_a_cancelled_action_and_a_conflicting_receipt_is_ignored() -> None:
    store = DurableMemoryStore()
    ctl = Controller(
        plugins=plugins_with(), store=store, plan_fn=_fixed_plan({"a": ["h1"]})
    ).restore()
    fleet = SimFleet.uniform(1, 16_000)
    hosts = [fleet.nodes["h1"].snapshot(NOW)]
    ctl.put_profile(ModelProfile(model_id="a", memory_mb=4000), NOW)
    ctl.set_mode("automatic", NOW)
    ctl.tick(NOW, hosts)
    delivered = ctl.deliver("h1", NOW, hosts, ctl.revisions.dirty).commands
    assert [c.kind for c in delivered] == ["load", "warm"]
    load = delivered[0]

    ctl.set_mode("recommend", NOW + 1)  # leaving automatic cancels pending commands
    assert ctl.book.get(load.action_id).status == "cancelled"  # type: ignore[union-attr]

    out = ctl.acknowledge(
        "h1", [Acknowledgement(action_id=load.action_id, status="succeeded")], NOW + 5
    )
    assert out == ["late"]
    rec = ctl.book.get(load.action_id)
    assert rec is not None and rec.status == "succeeded" and rec.late
    # A duplicate is harmless, a conflicting later receipt changes nothing.
    again = ctl.acknowledge(
        "h1",
        [
            Acknowledgement(action_id=load.action_id, status="succeeded"),
            Acknowledgement(action_id=load.action_id, status="failed"),
        ],
        NOW + 6,
    )
    assert again == ["duplicate", "conflict"]
    assert ctl.book.get(load.action_id).status == "succeeded"  # type: ignore[union-attr]
    history = {v.action_id: v for v in ctl.status(NOW + 7, detail=True).history}
    assert history[load.action_id].late is True


# --- withdrawn destructive batch ----------------------------------------------------------
def test_drain_withdrawn_after_delivery_blocks_destructive_work_until_its_receipt() -> None:
    fleet = SimFleet.uniform(2, 16_000, plan_fn=_fixed_plan({"a": ["h2"]}))
    fleet.nodes["h1"].residencies["a"] = SimResidency("a", 4000, "ready", loaded_at=0.0)
    for h in fleet.nodes:
        fleet.heartbeat(h)
    fleet.put_profile(
        ModelProfile(model_id="a", memory_mb=4000, min_replicas=1, min_residency_s=0.0)
    )
    fleet.ctl.set_mode("automatic", fleet.now)
    # Make before break: the replacement on h2 becomes ready first.
    for _ in range(4):
        fleet.now += 10
        fleet.heartbeat("h2")
        while fleet.nodes["h2"].started:
            fleet.complete("h2")
    fleet.now += 40
    fleet.heartbeat("h2")
    assert fleet.nodes["h2"].residencies["a"].state == "ready"
    fleet.heartbeat("h1", tick=True)  # the node would start it at once; deliver it by hand
    ctl = fleet.ctl
    drains = [a for a in ctl.book.active() if a.kind == "drain"]
    if not drains:  # the drain was proposed on this tick and already delivered to the sim
        drains = [a for a in ctl.book if a.kind == "drain"]
    assert len(drains) == 1
    drain = drains[0]
    assert drain.delivered
    # Pretend the node did not act yet: its report still says ready.
    fleet.nodes["h1"].residencies["a"].state = "ready"
    fleet.nodes["h1"].started.clear()
    fleet.nodes["h1"].outbox.clear()

    # Fresh evidence: the replacement host is reclaimed by its owner.
    fleet.nodes["h2"].lifecycle = "paused"
    fleet.now += 5
    fleet.heartbeat("h2")
    fleet.tick()
    status = ctl.status(fleet.now)
    assert [v.action_id for v in status.withdrawn_destructive] == [drain.action_id]
    assert status.blocked_models == {"a": [drain.action_id]}

    # The replacement recovers; still no new destructive work for "a", however long it waits.
    fleet.nodes["h2"].lifecycle = "accepting"
    for _ in range(5):
        fleet.now += 3600 * 24
        fleet.heartbeat("h2")
        fleet.heartbeat("h1")
        fleet.tick()
        assert not [a for a in ctl.book.active() if a.destructive]
        reasons = {(d.kind, d.host_id, d.reason) for d in ctl.last.report.deferred}
        assert ("drain", "h1", "destructive_blocked") in reasons

    # The authenticated terminal receipt of the withdrawn drain arrives: the block ends.
    ctl.acknowledge(
        "h1",
        [Acknowledgement(action_id=drain.action_id, status="failed", message="never started")],
        fleet.now,
    )
    assert ctl.status(fleet.now).blocked_models == {}
    fleet.now += 3600
    fleet.heartbeat("h2")
    fleet.heartbeat("h1")
    assert [a.kind for a in ctl.book.active() if a.host_id == "h1"] == ["drain"]


def test_a_heartbeat_proving_the_drain_also_releases_the_block() -> None:
    fleet = SimFleet.uniform(2, 16_000, plan_fn=_fixed_plan({"a": ["h2"]}))
    fleet.nodes["h1"].residencies["a"] = SimResidency("a", 4000, "ready", loaded_at=0.0)
    fleet.nodes["h2"].residencies["a"] = SimResidency("a", 4000, "ready", loaded_at=0.0)
    for h in fleet.nodes:
        fleet.heartbeat(h, tick=False)
    fleet.put_profile(
        ModelProfile(model_id="a", memory_mb=4000, min_replicas=1, min_residency_s=0.0)
    )
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.tick()
    ctl = fleet.ctl
    hosts = fleet.hosts()
    (drain,) = ctl.deliver("h1", fleet.now, hosts, ctl.revisions.dirty).commands
    assert drain.kind == "drain"
    fleet.nodes["h2"].lifecycle = "paused"
    fleet.now += 1
    fleet.heartbeat("h2")
    fleet.tick()
    assert ctl.status(fleet.now).blocked_models == {"a": [drain.action_id]}
    # The node had in fact started it: a newer heartbeat shows the residency draining.
    fleet.nodes["h1"].residencies["a"].state = "draining"
    fleet.now += 1
    fleet.heartbeat("h1")
    assert ctl.status(fleet.now).blocked_models == {}


def test_unbound_requests_become_workload_demand_for_the_best_feasible_model() -> None:
    """``auto`` coding requests are workload demand projected onto the highest-scoring model a
    host could hold, as inferred demand: never direct demand for any model."""
    from grid_core.controller import Controller
    from grid_core.demand.features import RequestFeatures
    from grid_core.profile import ModelProfile
    from grid_core.snapshot import HostSnapshot
    from grid_core.store import MemoryStore
    from grid_core.testing import plugins_with

    plugins = plugins_with(builtins=("grid_forecast_ewma", "grid_scoring", "grid_victims"))
    ctl = Controller(plugins=plugins, store=MemoryStore()).restore()
    now = 1_790_000_000.0
    ctl.put_profile(
        ModelProfile(model_id="coder", memory_mb=1000, workload_scores={"coding": 1.0}), now
    )
    ctl.put_profile(
        ModelProfile(model_id="giant-coder", memory_mb=900_000, workload_scores={"coding": 1.0}),
        now,
    )  # fits no host
    ctl.put_profile(
        ModelProfile(model_id="general", memory_mb=500, workload_scores={"coding": 0.4}), now
    )
    host = HostSnapshot(
        host_id="h1", capacity_mb=16_000, runtimes=("llama.cpp",), heartbeat_age_s=1.0
    )
    ctl.tick(now, [host])
    for i in range(30):
        ctl.observe_request(
            RequestFeatures(
                at=now + i,
                endpoint="chat",
                requested_model="auto",
                workload="coding",
                outcome="unavailable",
            )
        )
    result = ctl.tick(now + 40, [host])
    coder = ctl.last.forecasts["coder"]
    assert coder.inferred_rps > 0 and not coder.direct and coder.request_rate_rps == 0
    assert ctl.last.forecasts["giant-coder"].inferred_rps == 0
    assert ctl.last.forecasts["general"].inferred_rps == 0
    assert result.plan.desired["coder"] >= 1
    assert ctl.last.portfolio is not None and ctl.last.portfolio.mapping == {"coding": "coder"}
