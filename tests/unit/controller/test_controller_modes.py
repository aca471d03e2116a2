"""Modes, generations, fencing, restart grace and delivery revisions of the controller."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from simfleet import DurableMemoryStore, SimFleet, SimResidency

from grid_core.controller import Controller
from grid_core.demand import RequestFeatures
from grid_core.errors import ConflictError
from grid_core.profile import ModelProfile
from grid_core.store import state_digest
from grid_core.testing import plugins_with
from grid_server.store import FileStateStore

NOW = 1_000_000.0


def _fleet(placement: dict[str, list[str]] | None = None) -> SimFleet:
    fleet = SimFleet.uniform(2, 16_000)
    fleet.override = placement
    for h in fleet.nodes:
        fleet.heartbeat(h)
    fleet.put_profile(
        ModelProfile(model_id="a", memory_mb=4000, min_replicas=1, min_residency_s=0.0)
    )
    return fleet


def test_observe_records_drift_recommend_proposes_automatic_issues() -> None:
    fleet = _fleet()
    fleet.ctl.set_mode("observe", fleet.now)
    fleet.tick()
    rep = fleet.ctl.last.report
    assert rep is not None and rep.proposals == []
    assert [d.reason for d in rep.deferred] == ["observe_mode"]
    assert fleet.ctl.book.active() == []

    fleet.ctl.set_mode("recommend", fleet.now)
    fleet.tick()
    rep = fleet.ctl.last.report
    assert [p.kind for p in rep.proposals] == ["warm"] and rep.issued == []
    assert fleet.ctl.deliver("h1", fleet.now, fleet.hosts(), 0).commands == ()

    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.tick()
    assert [a.kind for a in fleet.ctl.book.active()] == ["load", "warm"]
    status = msgspec.json.decode(msgspec.json.encode(fleet.ctl.status(fleet.now, True)))
    for key in (
        "mode",
        "hosts",
        "profiles",
        "forecasts",
        "plan",
        "reconciliation",
        "pending_commands",
        "delivered_pending",
        "withdrawn_destructive",
        "unmet",
        "revisions",
        "last_tick_duration_ms",
        "state_warning",
        "history",
    ):
        assert key in status
    assert len(status["pending_commands"]) == 2


def test_leaving_automatic_cancels_pending_commands() -> None:
    fleet = _fleet()
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.tick()
    assert fleet.ctl.book.active()
    fleet.ctl.set_mode("recommend", fleet.now)
    assert fleet.ctl.book.active() == []
    assert {a.status for a in fleet.ctl.book} == {"cancelled"}


def test_generations_keep_increasing_across_restarts_within_one_epoch() -> None:
    fleet = _fleet()
    gens = []
    for _ in range(3):
        fleet.tick()
        gens.append(fleet.ctl.generations.current)
        fleet.ctl._save()  # recommend mode persists on a cadence; force it for the restart
        fleet.restart()
    fleet.tick()
    gens.append(fleet.ctl.generations.current)
    epochs = {g.split(":")[0] for g in gens}
    seqs = [int(g.split(":")[1]) for g in gens]
    assert len(epochs) == 1 and seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_retirement_tombstone_is_durable_until_the_profile_returns() -> None:
    fleet = _fleet()
    assert (
        fleet.ctl.observe_request(
            RequestFeatures(at=fleet.now, endpoint="chat", requested_model="a")
        )
        is None
    )
    assert fleet.ctl.demand.series("a") is not None  # counted before any tick
    fleet.remove_profile("a")
    assert fleet.ctl.demand.series("a") is None  # retirement clears demand history
    fleet.restart()
    assert "a" in fleet.ctl.status(fleet.now).retired
    fleet.put_profile(ModelProfile(model_id="a", memory_mb=4000))
    assert fleet.ctl.status(fleet.now).retired == {}


def test_restart_grace_holds_destructive_work_and_rebases_on_a_backward_clock() -> None:
    fleet = _fleet({"a": ["h2"]})
    fleet.nodes["h1"].residencies["a"] = SimResidency("a", 4000, "ready")
    fleet.nodes["h2"].residencies["a"] = SimResidency("a", 4000, "ready")
    for h in fleet.nodes:
        fleet.heartbeat(h, tick=False)
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.restart()  # the old process is gone; the new one restores automatic mode
    assert fleet.ctl.mode == "automatic"
    fleet.tick()
    rep = fleet.ctl.last.report
    assert rep.hold == "restart_grace"
    assert {(d.kind, d.reason) for d in rep.deferred} == {("drain", "restart_grace")}
    # The wall clock jumps back an hour: the grace restarts from the corrected time.
    fleet.now -= 3600.0
    for h in fleet.nodes:
        fleet.heartbeat(h, tick=False)
    fleet.tick()
    assert fleet.ctl.last.report.hold == "restart_grace"
    fleet.now += 30.0
    for h in fleet.nodes:
        fleet.heartbeat(h, tick=False)
    fleet.tick()
    assert fleet.ctl.last.report.hold == "restart_grace"
    fleet.now += 31.0
    for h in fleet.nodes:
        fleet.heartbeat(h, tick=False)
    fleet.tick()
    assert fleet.ctl.last.report.hold is None
    assert [a.kind for a in fleet.ctl.book.active()] == ["drain"]


def test_availability_rides_any_later_tick_but_destructive_needs_the_current_safety_revision() -> (
    None
):
    fleet = _fleet({"a": ["h2"]})
    fleet.nodes["h1"].residencies["a"] = SimResidency("a", 4000, "ready")
    fleet.nodes["h2"].residencies["a"] = SimResidency("a", 4000, "ready")
    for h in fleet.nodes:
        fleet.heartbeat(h, tick=False)
    ctl = fleet.ctl
    ctl.set_mode("automatic", fleet.now)
    ctl.tick(fleet.now, fleet.hosts())
    assert [a.kind for a in ctl.book.active()] == ["drain"]
    # A safety-relevant input after the tick: the drain must wait for a new tick.
    ctl.note_input(fleet.now, safety_changed=True)
    assert ctl.deliver("h1", fleet.now, fleet.hosts(), ctl.revisions.dirty).commands == ()
    assert ctl.book.active()[0].delivered_at is None
    ctl.tick(fleet.now, fleet.hosts())
    (cmd,) = ctl.deliver("h1", fleet.now, fleet.hosts(), ctl.revisions.dirty).commands
    assert cmd.kind == "drain" and cmd.controller_term == ctl.authority.term


def test_final_check_suppresses_and_unmarks_a_drain_whose_replacement_lease_is_short() -> None:
    fleet = _fleet({"a": ["h2"]})
    fleet.nodes["h1"].residencies["a"] = SimResidency("a", 4000, "ready")
    fleet.nodes["h2"].residencies["a"] = SimResidency("a", 4000, "ready")
    for h in fleet.nodes:
        fleet.heartbeat(h, tick=False)
    ctl = fleet.ctl
    ctl.set_mode("automatic", fleet.now)
    ctl.tick(fleet.now, fleet.hosts())
    # Fresh registry: the replacement's route has only 29 s of its 60 s lease left.
    fleet.now += 31.0
    fleet.nodes["h1"].last_report_at = fleet.now
    assert ctl.deliver("h1", fleet.now, fleet.hosts(), 0).commands == ()
    (drain,) = ctl.book.active()
    assert drain.delivered_at is None  # the prepared marker was removed durably
    fleet.nodes["h2"].last_report_at = fleet.now
    (cmd,) = ctl.deliver("h1", fleet.now, fleet.hosts(), 0).commands
    assert cmd.action_id == drain.action_id and drain.delivered_at == fleet.now


def test_restart_takes_over_with_a_higher_term_and_restamps_restored_commands(
    tmp_path: Path,
) -> None:
    path = tmp_path / "controller.json"
    plugins = plugins_with()
    fleet = _fleet()
    first = Controller(plugins=plugins, store=FileStateStore(path), plan_fn=fleet.plan_fn).restore()
    first.put_profile(ModelProfile(model_id="a", memory_mb=4000, min_replicas=1), NOW)
    first.set_mode("automatic", NOW)
    hosts = [fleet.nodes["h1"].snapshot(NOW)]
    first.tick(NOW, hosts)
    (load, warm) = first.deliver("h1", NOW, hosts, first.revisions.dirty).commands
    assert load.controller_term == 1

    # Same process, new controller identity: the live holder's lease blocks a takeover.
    with pytest.raises(ConflictError, match="holds the single-writer lease"):
        FileStateStore(path).acquire_lease("intruder", NOW + 1, 30.0)
    second = Controller(
        plugins=plugins, store=FileStateStore(path), plan_fn=fleet.plan_fn
    ).restore()
    assert second.mode == "automatic"
    second.tick(NOW + 2, hosts)  # could not take authority while first holds it
    assert second.authority.state.startswith("lost:")
    assert second.deliver("h1", NOW + 2, hosts, second.revisions.dirty).commands == ()

    # Once the first lease lapses, a restarted controller takes over with term 2 and
    # re-delivers the restored commands under its own authority.
    third = Controller(plugins=plugins, store=FileStateStore(path), plan_fn=fleet.plan_fn).restore()
    third.set_mode("automatic", NOW + 40)
    assert third.authority.term == 2
    hosts = [fleet.nodes["h1"].snapshot(NOW + 40)]
    third.tick(NOW + 40, hosts)
    assert third.last.report.hold == "restart_grace"
    again = third.deliver("h1", NOW + 40, hosts, third.revisions.dirty).commands
    assert [c.action_id for c in again] == [load.action_id, warm.action_id]
    assert {c.controller_term for c in again} == {2}
    assert {c.controller_id for c in again} == {third.authority.controller_id}


def test_a_dead_holder_on_this_machine_is_taken_over_before_its_lease_ends(tmp_path: Path) -> None:
    path = tmp_path / "controller.json"
    code = (
        "import sys; from grid_server.store import FileStateStore; "
        "print(FileStateStore(sys.argv[1]).acquire_lease('gone', 1000.0, 30.0))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "(1, 1030.0)"
    term, expires = FileStateStore(path).acquire_lease("next", 1001.0, 30.0)
    assert (term, expires) == (2, 1031.0)
    # Renewal by the same holder keeps the term.
    assert FileStateStore(path).acquire_lease("next", 1010.0, 30.0) == (2, 1040.0)


def test_state_file_is_owner_only_and_written_atomically(tmp_path: Path) -> None:
    path = tmp_path / "state" / "controller.json"
    store = FileStateStore(path)
    assert store.load() is None
    store.save(b'{"x": 1}', None)
    store.save(b'{"x": 2}', state_digest(b'{"x": 1}'))
    assert store.load() == b'{"x": 2}'
    assert path.stat().st_mode & 0o777 == 0o600
    # No temporary file is left behind (the OS lock file for conditional writes stays).
    assert sorted(p.name for p in path.parent.iterdir() if p.name != "controller.json.lock") == [
        "controller.json"
    ]


def test_restored_store_keeps_profiles_actions_and_blocks(tmp_path: Path) -> None:
    store = DurableMemoryStore()
    fleet = _fleet()
    a = Controller(plugins=plugins_with(), store=store, plan_fn=fleet.plan_fn).restore()
    a.put_profile(ModelProfile(model_id="a", memory_mb=4000, min_replicas=1), NOW)
    a.set_mode("automatic", NOW)
    a.tick(NOW, [fleet.nodes["h1"].snapshot(NOW)])
    ids = sorted(x.action_id for x in a.book.active())
    store.dead.add(a.authority.controller_id)
    b = Controller(plugins=plugins_with(), store=store, plan_fn=fleet.plan_fn).restore()
    assert sorted(x.action_id for x in b.book.active()) == ids
    assert list(b.profiles) == ["a"] and b.mode == "automatic" and b.authority.state == "pending"
    b.tick(NOW + 1, [fleet.nodes["h1"].snapshot(NOW + 1)])
    assert b.authority.term == 2 and b.authority.state == "held"


def test_failed_warms_steer_the_next_placement_to_a_healthy_peer() -> None:
    fleet = SimFleet.uniform(2, 16_000)
    for h in fleet.nodes:
        fleet.heartbeat(h)
    fleet.put_profile(ModelProfile(model_id="a", memory_mb=4000, min_replicas=1))
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.heartbeat("h1")
    fleet.heartbeat("h2")
    (first,) = {a.host_id for a in fleet.ctl.book.active()}
    other = "h2" if first == "h1" else "h1"
    # The chosen host fails the load (and so its dependent warm).
    fleet.complete(first, fail=True)
    fleet.converge(rounds=6)
    where = {h for h, n in fleet.nodes.items() if "a" in n.residencies}
    assert where == {other}
    assert fleet.violations == []


def test_authority_ttl_never_exceeds_one_lease_even_when_the_clock_jumps_back() -> None:
    fleet = _fleet()
    ctl = fleet.ctl
    ctl.set_mode("automatic", fleet.now)
    ctl.tick(fleet.now, fleet.hosts())
    first = ctl.deliver("h1", fleet.now, fleet.hosts(), 0)
    assert 0 < first.lease_ttl_s <= 30.0
    fleet.now -= 3600.0  # the server's wall clock is corrected backward by an hour
    for h in fleet.nodes:
        fleet.nodes[h].last_report_at = fleet.now
    later = ctl.deliver("h1", fleet.now, fleet.hosts(), 0)
    assert 0 < later.lease_ttl_s <= 30.0
    assert ctl.authority.lease_expires_at == fleet.now + 30.0  # renewed against the corrected clock


def test_a_superseded_controller_loses_authority_and_sends_nothing() -> None:
    fleet = _fleet()
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.tick()
    old = fleet.ctl
    fleet.restart(keep_zombie=True)  # the old process lingers (split brain)
    fleet.tick()
    assert fleet.ctl.authority.state.startswith("lost:")  # its lease is still live
    fleet.now += 31.0  # the old lease lapses without renewal
    for h in fleet.nodes:
        fleet.heartbeat(h)
    assert (
        fleet.ctl.authority.state == "held" and fleet.ctl.authority.term == old.authority.term + 1
    )
    assert (
        fleet.nodes["h1"].highest_term == fleet.ctl.authority.term
        or fleet.nodes["h2"].highest_term == fleet.ctl.authority.term
    )
    # The old controller still believes it is automatic; it must not command anyone now.
    for h in fleet.nodes:
        assert old.deliver(h, fleet.now, fleet.hosts(), old.revisions.dirty).commands == ()
        fleet.zombie_deliver(h)
    assert old.authority.state.startswith("lost:")
    assert fleet.violations == []
