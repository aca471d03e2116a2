"""``grid test start`` against a recorded fleet, without starting one: flags left out,
the memory split, and how a request that differs from the running fleet is refused."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from fleet_records import saved_fleet
from grid_fleet import layout
from grid_fleet.layout import FleetRecord, FleetSettings

from grid_core.errors import ValidationError


@contextlib.contextmanager
def _running_fleet(root: Path) -> Iterator[FleetRecord]:
    """A recorded 2-machine fleet whose server is a live child carrying the fleet's marker,
    so the record is proven running; the child is killed on exit."""
    import subprocess
    import sys

    import psutil

    marker = ("--fleet-record", str(root))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *marker])
    try:
        server = layout.ProcessRecord(
            pid=proc.pid, birth=psutil.Process(proc.pid).create_time(), marker=marker
        )
        yield saved_fleet(root, server=server)
    finally:
        proc.kill()
        proc.wait()


def test_start_with_other_settings_names_the_flags_in_their_units(tmp_path):
    # A second start with other settings is refused naming the flags the operator typed and
    # the values in those flags' units (GiB), not the record's field names and MB tuples.
    from grid_fleet import lifecycle

    from grid_core.errors import SettingsConflictError

    root = tmp_path / "fleet"
    with _running_fleet(root) as rec:
        asked = FleetSettings(
            machines=3, port=1, engine_port_base=30000, capacities_mb=(3072, 3072, 1536), models=()
        )
        with pytest.raises(SettingsConflictError) as exc:
            lifecycle.start(asked, lambda _line: None, root)
    assert str(exc.value) == (
        "a fleet with different settings is running (--machines: running 2, asked 3; "
        "host memory in GiB (--text-capacities-gib): running 2,2, asked 3,3,1.5); "
        "run 'grid test stop' first"
    )
    assert layout.load_record(root) == rec  # the running fleet's record is untouched


def _settings(machines: int, caps: tuple[int, ...]) -> FleetSettings:
    return FleetSettings(
        machines=machines, port=1, engine_port_base=30000, capacities_mb=caps, models=()
    )


def test_a_split_derived_from_machines_is_not_named_as_asked():
    # Without --text-capacities-gib the split follows from --machines: the refusal names
    # only --machines, the flag the operator did ask differently.
    running, asked = _settings(4, (2048,) * 4), _settings(3, (2730,) * 3)
    assert layout.settings_conflicts(running, asked, capacities_given=False) == [
        "--machines: running 4, asked 3"
    ]
    # Given explicitly, a different split is the operator's own request and is named.
    assert layout.settings_conflicts(running, asked) == [
        "--machines: running 4, asked 3",
        "host memory in GiB (--text-capacities-gib): running 2,2,2,2, asked 2.67,2.67,2.67",
    ]


def test_a_split_that_differs_below_two_places_of_gib_is_named_in_mb():
    # 'grid test status' shows an equal split of 10724 MB as 10.47 GiB; asking for 10.47
    # gives 10721 MB. The refusal must not read "running 10.47,10.47, asked 10.47,10.47".
    assert layout.settings_conflicts(
        _settings(2, (10724, 10724)), _settings(2, (10721, 10721))
    ) == ["host memory in MB (--text-capacities-gib): running 10724,10724, asked 10721,10721"]


def test_a_derived_split_alone_is_named_as_derived_never_as_asked():
    [phrase] = layout.settings_conflicts(
        _settings(2, (2048, 2048)), _settings(2, (3072, 3072)), capacities_given=False
    )
    assert "asked" not in phrase.replace("not asked", "")
    assert "derived from --machines" in phrase and "running 2,2, would be 3,3" in phrase


def test_start_capacities_reuse_the_running_split_only_for_the_same_request(usable):
    running = _settings(2, (3000, 3000))
    # The same request (same --machines, no --text-capacities-gib) means the same fleet.
    assert layout.start_capacities(2, None, running) == (3000, 3000)
    # Another machine count, or explicit values, are planned afresh.
    assert layout.start_capacities(4, None, running) == (5000,) * 4
    assert layout.start_capacities(2, "4,4", running) == (4096, 4096)
    assert layout.start_capacities(2, None, None) == (10_000, 10_000)
    with pytest.raises(ValidationError, match="--machines 0"):
        layout.start_capacities(0, None, running)


def test_the_running_fleets_own_request_is_not_refused_for_the_memory_it_holds(monkeypatch):
    # The running fleet holds part of this machine's memory: asking for it again, with the
    # same --text-capacities-gib (and the media node's share), must answer with its split
    # rather than fail the free-memory check it passed when it started.
    monkeypatch.setattr(layout, "usable_memory_mb", lambda: 3000)
    running = _settings(2, (4096, 4096))
    assert layout.start_capacities(2, "4,4", running) == (4096, 4096)
    assert layout.start_capacities(2, None, running) == (4096, 4096)
    media = FleetSettings(
        machines=3,
        port=1,
        engine_port_base=30000,
        capacities_mb=(4096, 4096, 6000),
        models=(),
        include_comfyui=True,
    )
    assert layout.start_capacities(3, "4,4", media, media=True) == (4096, 4096, 6000)
    # Any other request is checked against the memory free now.
    with pytest.raises(ValidationError, match="can give only 3000 MB"):
        layout.start_capacities(2, "4,3", running)
    with pytest.raises(ValidationError, match="can give only 3000 MB"):
        layout.start_capacities(3, "4,4,4", media)  # no media node: another fleet


def test_start_refusal_lists_only_the_flags_the_operator_gave(
    tmp_path, monkeypatch, capsys, usable
):
    # 'grid test start --machines 3' beside a running 2-machine fleet: the refusal names
    # --machines, not a host memory flag the operator never typed.
    from grid_core.cli import main

    monkeypatch.setenv("GRID_HOME", str(tmp_path))
    root = tmp_path / "fleet"
    with _running_fleet(root) as rec, pytest.raises(SystemExit) as exc:
        main(["test", "start", "--machines", "3", "--port", "1", "--engine-port-base", "30000"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "(--machines: running 2, asked 3)" in err, err
    assert "--text-capacities-gib" not in err and "host memory" not in err, err
    assert layout.load_record(root) == rec  # the running fleet's record is untouched


def test_flags_left_out_take_the_recorded_fleets_values_else_the_defaults():
    # A bare 'grid test start' beside a running fleet asks for that fleet, not a default one.
    running = FleetSettings(
        machines=2, port=1, engine_port_base=30000, capacities_mb=(2048, 2048), models=("/m",)
    )
    asked = layout.fill_left_out(layout.StartFlags(), running)
    assert msgspec.structs.replace(asked, capacities_mb=running.capacities_mb) == running
    assert layout.start_capacities(asked.machines, None, running) == running.capacities_mb
    # Without a record: the documented defaults.
    fresh = layout.fill_left_out(layout.StartFlags(), None)
    assert (fresh.machines, fresh.port, fresh.engine_port_base, fresh.models) == (
        layout.DEFAULT_MACHINES,
        layout.DEFAULT_PORT,
        layout.DEFAULT_ENGINE_PORT_BASE,
        (),
    )
    # --text-capacities-gib alone says how many machines (plus the media node).
    assert layout.fill_left_out(layout.StartFlags(capacities_gib="6,4,4"), running).machines == 3
    media = layout.StartFlags(capacities_gib="4,4", include_comfyui=True)
    assert layout.fill_left_out(media, None).machines == 3
    # A value that is not a number is named as such, not counted as a machine.
    with pytest.raises(ValidationError, match="--text-capacities-gib '1,2,x': use comma"):
        layout.fill_left_out(layout.StartFlags(capacities_gib="1,2,x"), running)
    # A flag given wins over the record.
    assert layout.fill_left_out(layout.StartFlags(machines=5, port=9), running).port == 9


def test_start_beside_a_running_fleet_names_the_conflict_before_any_memory_or_media_check(
    tmp_path, monkeypatch, capsys
):
    # '--machines 32' (more than this machine's memory) or '--include-comfyui' without a
    # bundle beside a running fleet: the answer is the conflict, not why such a fleet could
    # not start anyway.
    from grid_core.cli import main

    monkeypatch.setattr(layout, "usable_memory_mb", lambda: 3000)
    monkeypatch.setenv("GRID_HOME", str(tmp_path))
    root = tmp_path / "fleet"
    with _running_fleet(root) as rec:
        for argv, named in (
            (["--machines", "32"], "--machines: running 2, asked 32"),
            (["--include-comfyui"], "--include-comfyui: running off, asked on"),
            (
                ["--text-capacities-gib", "2,2,2"],
                "machines (one per --text-capacities-gib value): running 2, asked 3",
            ),
            # The same count, other values (more than this machine can give): the docs'
            # own example of a refusal, named before the free-memory check.
            (
                ["--text-capacities-gib", "9,9"],
                "host memory in GiB (--text-capacities-gib): running 2,2, asked 9,9",
            ),
        ):
            with pytest.raises(SystemExit) as exc:
                main(["test", "start", *argv])
            assert exc.value.code == 2
            err = capsys.readouterr().err
            assert f"({named}); run 'grid test stop' first" in err, err
            assert "can give only" not in err and "--media-bundle" not in err, err
            assert "--port" not in err, err  # left out: the running fleet's port is asked
        assert layout.load_record(root) == rec
