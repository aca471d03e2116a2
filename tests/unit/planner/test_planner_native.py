"""The planner's native (mypyc) build: used when it matches the sources, never when stale,
and it decides exactly what the interpreted planner decides."""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import grid_core.planner as planner_pkg
from grid_core import native

FLEET_DIR = Path(__file__).resolve().parents[2] / "data" / "fleets"
GENERATED = [(64, 32, seed, occ) for seed in (3, 4, 5) for occ in (0.0, 0.5)] + [
    (24, 16, 11, 0.25),
    (128, 48, 8, 0.0),
]
"""Generated fleets (hosts, models, seed, occupancy) both builds plan, besides the stored ones."""

PLAN_ALL = """
import hashlib, json, sys
from pathlib import Path
import msgspec
from grid_bench.fleet import fleet_inputs, load_fleet
from grid_bench.fleet_make import make_fleet
from grid_core.api import get_plugins, plan
import grid_core.planner as planner_pkg
hooks = get_plugins().planner_hooks()
stored, generated = json.loads(sys.argv[1]), json.loads(sys.argv[2])
fleets = [load_fleet(Path(p)) for p in stored] + [make_fleet(*g) for g in generated]
digests = [
    hashlib.sha256(msgspec.json.encode(plan(fleet_inputs(f), hooks, reuse=False))).hexdigest()
    for f in fleets
]
print(json.dumps({"native": planner_pkg.NATIVE.active, "digests": digests}))
"""


def _plan_digests(native_on: bool) -> dict:
    env = dict(os.environ)
    env[native.NATIVE_ENV] = "1" if native_on else "0"
    stored = json.dumps(sorted(str(p) for p in FLEET_DIR.glob("*.json")))
    done = subprocess.run(
        [sys.executable, "-c", PLAN_ALL, stored, json.dumps(GENERATED)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=600,
    )
    return json.loads(done.stdout)


def test_the_planner_runs_its_native_build_when_one_matches_the_sources():
    # `make test` builds it first (`make native`); run that when this fails after an edit.
    status = planner_pkg.NATIVE
    assert status.active, status.reason
    assert status.path is not None
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for name in native.compiled_modules():
        module = importlib.import_module(f"grid_core.planner.{Path(name).stem}")
        assert module.__file__ is not None
        assert module.__file__.endswith(suffixes), module.__file__
        assert Path(module.__file__).is_relative_to(status.path)
    for stem in ("types", "hooks", "exact"):
        module = importlib.import_module(f"grid_core.planner.{stem}")
        assert module.__file__ is not None and module.__file__.endswith(".py")


def test_the_native_and_the_interpreted_planner_make_the_same_plans():
    native_run = _plan_digests(native_on=True)
    interpreted_run = _plan_digests(native_on=False)
    assert native_run["native"] is True
    assert interpreted_run["native"] is False
    assert len(native_run["digests"]) == len(GENERATED) + len(list(FLEET_DIR.glob("*.json")))
    assert native_run["digests"] == interpreted_run["digests"]


def test_turning_the_native_build_off_keeps_the_package_path(monkeypatch):
    monkeypatch.setenv(native.NATIVE_ENV, "0")
    path = ["/src/grid_core/planner"]
    status = native.activate(path)
    assert not status.active
    assert f"{native.NATIVE_ENV}=0" in status.reason
    assert path == ["/src/grid_core/planner"]


def test_without_a_build_for_these_sources_the_planner_runs_interpreted(monkeypatch, tmp_path):
    monkeypatch.delenv(native.NATIVE_ENV, raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    # a build of other sources is never used
    stale = tmp_path / native.NATIVE_DIR_NAME / f"{sys.implementation.cache_tag}-{'0' * 20}"
    stale.mkdir(parents=True)
    (stale / native.MANIFEST_NAME).write_text("core.py\n")
    path: list[str] = []
    status = native.activate(path)
    assert not status.active
    assert "no native build for these sources" in status.reason
    assert "make native" in status.reason
    assert path == []


def _fake_build(tmp_path: Path, monkeypatch) -> Path:
    """A build directory for the current sources under a fake ``sys.prefix``, with one
    compiled module file and one runtime library, listed in a manifest."""
    monkeypatch.delenv(native.NATIVE_ENV, raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    where = native.build_dir(native.source_digest())
    (where / "grid_core" / "planner").mkdir(parents=True)
    (where / "grid_core" / "planner" / "core.so").write_bytes(b"x" * 64)
    (where / "abc__mypyc.so").write_bytes(b"y" * 128)
    native.write_manifest(where, ["core.py"])
    return where


def test_an_incomplete_build_is_not_loaded(monkeypatch, tmp_path):
    where = _fake_build(tmp_path, monkeypatch)
    doc = json.loads((where / native.MANIFEST_NAME).read_text())
    doc["modules"] = ["core.py", "ledger.py"]
    (where / native.MANIFEST_NAME).write_text(json.dumps(doc))
    path: list[str] = []
    status = native.activate(path)
    assert not status.active
    assert "compiled modules missing from the native build: ledger" in status.reason
    assert "python -m grid_core.system.native_build" in status.reason
    assert path == []


@pytest.mark.parametrize("damage", ["truncate", "remove"])
def test_a_damaged_build_is_never_mapped(monkeypatch, tmp_path, damage):
    # A truncated shared library kills the process that maps it (SIGBUS): the sizes the
    # manifest records are checked before anything of the build is loaded.
    where = _fake_build(tmp_path, monkeypatch)
    runtime = where / "abc__mypyc.so"
    if damage == "truncate":
        runtime.write_bytes(b"y" * 100)
    else:
        runtime.unlink()
    path: list[str] = []
    status = native.activate(path)
    assert not status.active
    expected = "is 100 bytes, not 128 (damaged)" if damage == "truncate" else "lacks abc__mypyc"
    assert expected in status.reason
    assert path == []
    assert "abc__mypyc" not in sys.modules


def test_a_module_that_fails_to_load_leaves_the_source_modules_in_use(tmp_path, monkeypatch):
    # A stand-in package with a source module, and a "build" of it whose second module
    # fails on import: the build's first module is forgotten again and the source one loads.
    src = tmp_path / "src" / "nativeprobe"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "good.py").write_text("BUILD = 'source'\n")
    built = tmp_path / "build" / "nativeprobe"
    built.mkdir(parents=True)
    (built / "good.py").write_text("BUILD = 'native'\n")
    (built / "bad.py").write_text("raise ImportError('cannot load bad')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    package = importlib.import_module("nativeprobe")
    try:
        with pytest.raises(ImportError, match="cannot load bad"):
            native._import_compiled("nativeprobe", package.__path__, built, ["good", "bad"])
        assert str(built) not in package.__path__
        assert "nativeprobe.good" not in sys.modules
        assert importlib.import_module("nativeprobe.good").BUILD == "source"
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "nativeprobe"]:
            del sys.modules[name]


@pytest.mark.parametrize(
    ("value", "active_possible", "said"),
    [
        ("off", False, "turned off by GRID_PLANNER_NATIVE=off"),
        ("FALSE", False, "turned off by GRID_PLANNER_NATIVE=false"),
        ("No", False, "turned off by GRID_PLANNER_NATIVE=no"),
        ("maybe", True, "GRID_PLANNER_NATIVE='maybe' not understood"),
    ],
)
def test_the_switch_takes_the_usual_words_and_names_one_it_does_not_know(
    monkeypatch, tmp_path, value, active_possible, said
):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # no build here
    monkeypatch.setenv(native.NATIVE_ENV, value)
    status = native.activate([])
    assert not status.active
    assert said in status.reason
    assert ("no native build for these sources" in status.reason) is active_possible


def test_any_edit_to_grid_core_changes_the_source_digest(tmp_path):
    core = tmp_path / "grid_core"
    (core / "planner").mkdir(parents=True)
    (core / "constants.py").write_text("LIMIT = 3\n")
    (core / "planner" / "core.py").write_text("def f() -> int:\n    return 1\n")
    first = native.source_digest(core)
    assert native.source_digest(core) == first
    # a module the planner imports changes: its Final constants may be compiled in
    (core / "constants.py").write_text("LIMIT = 4\n")
    second = native.source_digest(core)
    assert second != first
    # same bytes under another name
    (core / "constants.py").rename(core / "limits.py")
    assert native.source_digest(core) not in (first, second)
    assert len(native.source_digest(core)) == len(hashlib.sha256().hexdigest())


def test_the_bench_reports_which_planner_build_it_timed(tmp_path):
    from grid_bench.fleet_make import make_fleet
    from grid_bench.plan_bench import run_plan_bench

    fleet = tmp_path / "fleet.json"
    fleet.write_bytes(msgspec.json.encode(make_fleet(8, 6, 1, 0.0)))
    out = run_plan_bench(fleet, runs=1)
    assert out["planner_build"] == "native"
    assert out["planner_build_reason"].startswith("native: mypyc build in ")
