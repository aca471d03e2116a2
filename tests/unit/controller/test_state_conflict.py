"""Conditional state writes: a superseded controller instance never overwrites newer state.

Specification, "Local wire contract" and "HTTP control surface": one writer at a time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from simfleet import SimFleet

from grid_core.controller import Controller
from grid_core.profile import ModelProfile
from grid_core.reconcile.authority import SUPERSEDED
from grid_core.store import StateConflictError, state_digest
from grid_core.testing import plugins_with
from grid_server.store import FileStateStore

NOW = 1_000_000.0


def _profile(model_id: str, memory_mb: int = 4000) -> ModelProfile:
    return ModelProfile(model_id=model_id, memory_mb=memory_mb, min_replicas=1)


def test_a_lingering_old_controller_cannot_erase_a_profile_added_after_restart() -> None:
    # Controller A runs in automatic mode with work in flight.
    fleet = SimFleet.uniform(2, 16_000)
    for h in fleet.nodes:
        fleet.heartbeat(h)
    fleet.put_profile(_profile("a"))
    fleet.put_profile(_profile("b"))
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.converge(rounds=2)
    old = fleet.ctl
    # A restart creates B from the same store while A keeps running.
    fleet.restart(keep_zombie=True)
    # A new profile arrives through B, which saves it.
    fleet.put_profile(_profile("c"))
    # A delivers and ticks with its older view (no "c").
    fleet.now += 1.0
    for h in sorted(fleet.nodes):
        fleet.zombie_deliver(h)
    old.tick(fleet.now, fleet.hosts())

    # The next restart still restores "c": A's stale writes were refused.
    fleet.restart()
    assert sorted(fleet.ctl.profiles) == ["a", "b", "c"]

    # A knows it is superseded, says so in status, and commands nobody.
    status = old.status(fleet.now)
    assert status.authority == SUPERSEDED
    assert "written by another controller" in (status.state_warning or "")
    for h in sorted(fleet.nodes):
        d = old.deliver(h, fleet.now, fleet.hosts(), old.revisions.dirty)
        assert d.commands == () and d.lease_ttl_s == 0.0
    # Operator changes through A are refused rather than silently lost.
    with pytest.raises(StateConflictError, match="superseded"):
        old.put_profile(_profile("d"), fleet.now)
    assert fleet.violations == []


def test_two_servers_on_one_state_file_keep_the_newer_write(tmp_path: Path) -> None:
    path = tmp_path / "state" / "controller.json"
    plugins = plugins_with()
    fleet = SimFleet.uniform(1, 16_000)
    fleet.heartbeat("h1")
    hosts = fleet.hosts()
    a = Controller(plugins=plugins, store=FileStateStore(path), plan_fn=fleet.plan_fn).restore()
    a.put_profile(_profile("a"), NOW)
    a.set_mode("automatic", NOW)
    a.tick(NOW, hosts)
    b = Controller(plugins=plugins, store=FileStateStore(path), plan_fn=fleet.plan_fn).restore()
    b.put_profile(_profile("c"), NOW + 1)
    written_by_b = path.read_bytes()

    a.tick(NOW + 2, hosts)  # automatic mode saves every tick: refused

    assert path.read_bytes() == written_by_b
    assert a.authority.state == SUPERSEDED and a.authority.superseded
    assert a.deliver("h1", NOW + 2, hosts, a.revisions.dirty).commands == ()
    restored = Controller(
        plugins=plugins, store=FileStateStore(path), plan_fn=fleet.plan_fn
    ).restore()
    assert sorted(restored.profiles) == ["a", "c"]


def test_file_store_refuses_a_writer_with_a_stale_digest(tmp_path: Path) -> None:
    path = tmp_path / "state" / "controller.json"
    first, second = FileStateStore(path), FileStateStore(path)
    first.save(b'{"v": 1}', None)
    seen_by_second = state_digest(second.load())
    first.save(b'{"v": 2}', state_digest(b'{"v": 1}'))

    with pytest.raises(StateConflictError, match="written by another controller"):
        second.save(b'{"v": "stale"}', seen_by_second)
    assert path.read_bytes() == b'{"v": 2}'
    # Creating state that already exists is a conflict too.
    with pytest.raises(StateConflictError):
        second.save(b'{"v": "stale"}', None)
    assert path.read_bytes() == b'{"v": 2}'
    # A writer whose view is current succeeds.
    second.save(b'{"v": 3}', state_digest(second.load()))
    assert first.load() == b'{"v": 3}'
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_single_server_keeps_saving_and_restores_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "controller.json"
    plugins = plugins_with()
    fleet = SimFleet.uniform(1, 16_000)
    fleet.heartbeat("h1")
    ctl = Controller(plugins=plugins, store=FileStateStore(path), plan_fn=fleet.plan_fn).restore()
    for i in range(3):
        ctl.put_profile(_profile(f"m{i}", 1000), NOW + i)
        ctl.tick(NOW + i, fleet.hosts())
    ctl.remove_profile("m0", NOW + 4)
    assert ctl.document.warning is None and not ctl.authority.superseded
    # Restart (the old process is gone): the new one restores and keeps writing.
    again = Controller(plugins=plugins, store=FileStateStore(path), plan_fn=fleet.plan_fn).restore()
    assert sorted(again.profiles) == ["m1", "m2"] and "m0" in again.tombstones
    again.put_profile(_profile("m3", 1000), NOW + 5)
    assert again.document.warning is None and not again.authority.superseded
    third = Controller(plugins=plugins, store=FileStateStore(path), plan_fn=fleet.plan_fn).restore()
    assert sorted(third.profiles) == ["m1", "m2", "m3"]


def test_corrupt_state_is_quarantined_and_the_clean_start_can_save(tmp_path: Path) -> None:
    path = tmp_path / "controller.json"
    path.write_bytes(b"{not json")
    ctl = Controller(plugins=plugins_with(), store=FileStateStore(path)).restore()
    assert "moved to" in (ctl.document.warning or "")
    ctl.put_profile(_profile("a"), NOW)
    assert not ctl.authority.superseded
    assert sorted(
        Controller(plugins=plugins_with(), store=FileStateStore(path)).restore().profiles
    ) == ["a"]
