"""The native planner's builder: keeps a complete build, rebuilds a damaged one, keeps the
most recently used builds, and reports a failure in one line (or one JSON object)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest
import typer
from filelock import FileLock
from typer.testing import CliRunner

from grid_core import native
from grid_core.system import native_build


def _complete_build(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    where = native.build_dir(native.source_digest())
    (where / "grid_core" / "planner").mkdir(parents=True)
    for name in native.compiled_modules():
        (where / "grid_core" / "planner" / f"{Path(name).stem}.so").write_bytes(b"x" * 16)
    (where / "abc__mypyc.so").write_bytes(b"y" * 32)
    native.write_manifest(where, native.compiled_modules())
    return where


def test_a_complete_build_of_these_sources_is_kept_and_marked_used(tmp_path, monkeypatch):
    where = _complete_build(tmp_path, monkeypatch)
    old = time.time() - 3600
    os.utime(where, (old, old))

    def no_compile(final: Path, digest: str) -> None:
        raise AssertionError("compiled although a complete build exists")

    monkeypatch.setattr(native_build, "_compile", no_compile)
    assert native_build.is_current()
    assert native_build.build() == (where, False)
    assert where.stat().st_mtime > old + 3000


def test_a_damaged_build_is_not_current_and_is_built_again(tmp_path, monkeypatch):
    where = _complete_build(tmp_path, monkeypatch)
    (where / "abc__mypyc.so").write_bytes(b"y")  # truncated
    compiled: list[Path] = []
    monkeypatch.setattr(native_build, "_compile", lambda final, digest: compiled.append(final))
    assert not native_build.is_current()
    assert native_build.build() == (where, True)
    assert compiled == [where]


def test_the_most_recently_used_builds_are_kept(tmp_path):
    tag = sys.implementation.cache_tag
    now = time.time()
    dirs = []
    for age in range(6):  # build 0 was used last, build 5 first
        d = tmp_path / f"{tag}-{age:020d}"
        d.mkdir()
        os.utime(d, (now - 60 * age, now - 60 * age))
        dirs.append(d)
    other_python = tmp_path / "cpython-399-00000000000000000000"
    other_python.mkdir()
    stopped = tmp_path / ".building-stopped"  # a build killed midway (the lock is held now)
    stopped.mkdir()
    keep = dirs[4]  # the one just built or used
    native_build._remove_older(tmp_path, keep=keep)
    left = {p.name for p in tmp_path.iterdir()}
    newest_others = {d.name for d in dirs[: native_build.BUILDS_KEPT - 1]}
    assert left == newest_others | {keep.name, other_python.name}


def test_a_failed_build_says_so_in_one_line_or_one_json_object(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))

    def fails(**options: object) -> tuple[Path, bool]:
        msg = "the mypyc build failed (exit 1; it needs a C compiler ...):\nerror: no gcc"
        raise native_build.NativeBuildError(msg)

    monkeypatch.setattr(native_build, "build", fails)
    app = typer.Typer()
    app.command()(native_build.main)
    runner = CliRunner()
    out = runner.invoke(app, ["--json"])
    assert out.exit_code == 1
    doc = json.loads(out.stdout.splitlines()[0])
    assert doc["built"] is False and "no gcc" in doc["error"]
    plain = runner.invoke(app, [])
    assert plain.exit_code == 1
    assert "Traceback" not in plain.output
    assert "grid: error: the mypyc build failed" in plain.output


def test_a_stopped_compile_leaves_no_process_of_its_own_behind(tmp_path, monkeypatch):
    # The compile's own children (setuptools starts the C compiler) are stopped with it:
    # here a shell stands in for setuptools and a sleep for the compiler.
    monkeypatch.setattr(native_build, "BUILD_TIMEOUT_S", 1.0)
    pid_file = tmp_path / "grandchild.pid"
    argv = ["/bin/sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"]
    with pytest.raises(native_build.NativeBuildError, match="took more than 1 s"):
        native_build._run(argv, tmp_path)
    grandchild = int(pid_file.read_text())
    try:
        proc = psutil.Process(grandchild)
    except psutil.NoSuchProcess:
        return
    try:
        # Checked at once: the build returns only when its killed processes have stopped.
        assert proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass
    finally:  # never leave the stand-in compiler running, even when the check fails
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.status() != psutil.STATUS_ZOMBIE and proc.name() == "sleep":
                proc.kill()


def test_a_build_waiting_for_another_says_so_and_gives_up_at_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(native_build, "LOCK_WAIT_S", 0.2)
    root = native.native_root()
    root.mkdir(parents=True)
    held = FileLock(root / native_build.LOCK_NAME)
    held.acquire()
    waited: list[Path] = []
    try:
        with pytest.raises(native_build.NativeBuildError, match="another native build held"):
            native_build.build(on_wait=waited.append)
    finally:
        held.release()
    assert waited == [root / native_build.LOCK_NAME]
