"""The host-OS toolkit against the real OS: real child processes, signals, files and modes."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import anyio
import pytest

from grid_core.errors import ForbiddenError, StateError
from grid_core.system import (
    BIRTH_TOLERANCE_S,
    ProcessIdentity,
    SpawnedChild,
    birth_of,
    exit_status,
    grid_home,
    is_gone,
    spawn_detached,
    stop_process,
    stop_process_sync,
    wait_until,
    wait_until_sync,
    write_atomic,
)

STUBBORN = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: print('term ignored', flush=True))\n"
    "print('up', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)
"""A child that ignores SIGTERM: only SIGKILL ends it."""
POLITE = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"
"""A child that exits on SIGTERM (the default action)."""


def _spawn(tmp_path: Path, code: str, *, tag: str = "") -> int:
    argv = [sys.executable, "-c", code, "--tag", tag or "t"]
    pid = spawn_detached(argv, log_path=tmp_path / "child.log")
    assert wait_until_sync(lambda: "up" in (tmp_path / "child.log").read_text(), timeout_s=30)
    return pid


@pytest.fixture
def cleanup():
    pids: list[int] = []
    yield pids
    for pid in pids:
        if exit_status(pid) is None:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


# --- durable atomic write -------------------------------------------------------------------
@pytest.mark.parametrize("mode", [0o600, 0o644])
def test_write_atomic_sets_the_requested_mode_whatever_the_umask(tmp_path: Path, mode: int):
    old = os.umask(0o077 if mode == 0o644 else 0o000)
    try:
        write_atomic(tmp_path / "f", b"one")
        write_atomic(tmp_path / "f", "two", mode=mode)
    finally:
        os.umask(old)
    assert (tmp_path / "f").read_text() == "two"
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["f"]  # no temp file left behind


def test_write_atomic_failure_names_the_file_and_leaves_no_temp_file(tmp_path: Path):
    target = tmp_path / "state.json"
    target.mkdir()  # the rename cannot replace a directory: the write must fail cleanly
    (target / "kept").write_text("old")
    with pytest.raises(StateError, match=r"state\.json"):
        write_atomic(target, b"new")
    assert (target / "kept").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    with pytest.raises(StateError, match="directory exists"):
        write_atomic(tmp_path / "missing" / "f", b"x")


# --- identity -------------------------------------------------------------------------------
def test_identity_proof_checks_birth_command_line_and_death(tmp_path: Path, cleanup):
    pid = _spawn(tmp_path, POLITE, tag="mine")
    cleanup.append(pid)
    birth = birth_of(pid)
    assert ProcessIdentity(pid, birth, args=(("--tag", "mine"),)).prove().status == "proven"
    assert ProcessIdentity(pid, birth, executable=sys.executable).prove().status == "proven"
    reused = ProcessIdentity(pid, birth - 10 * BIRTH_TOLERANCE_S).prove()
    assert (reused.status, "reused" in reused.reason) == ("unproven", True)
    other = ProcessIdentity(pid, birth, args=(("--tag", "theirs"),)).prove()
    assert other.status == "unproven" and "--tag theirs" in other.reason
    assert ProcessIdentity(pid, None).prove().status == "unproven"
    assert ProcessIdentity(pid, birth, cmdline=("x",)).prove().status == "unproven"
    os.kill(pid, signal.SIGKILL)
    assert wait_until_sync(lambda: is_gone(pid), timeout_s=10)
    assert ProcessIdentity(pid, birth).prove().status == "dead"  # a zombie is not alive


def test_identity_of_current_process_is_proven():
    assert ProcessIdentity.of_current().prove().status == "proven"


# --- spawn ----------------------------------------------------------------------------------
def test_spawn_detached_gives_own_session_owner_only_log_and_no_secrets(
    tmp_path: Path, cleanup, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GRID_ALLOCATOR_TOKEN", "secret-operator")
    monkeypatch.setenv("GRID_ENGINE_API_KEY", "secret-engine")
    code = "import os\nprint(sorted(k for k in os.environ if k.startswith('GRID_')))\nprint('up')"
    pid = spawn_detached([sys.executable, "-c", code], log_path=tmp_path / "child.log")
    cleanup.append(pid)
    log = tmp_path / "child.log"
    assert wait_until_sync(lambda: "up" in log.read_text(), timeout_s=30)
    assert "GRID_ALLOCATOR_TOKEN" not in log.read_text()
    assert "GRID_ENGINE_API_KEY" not in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_spawned_child_runs_in_its_own_session(tmp_path: Path, cleanup):
    pid = _spawn(tmp_path, POLITE)
    cleanup.append(pid)
    assert os.getsid(pid) == pid != os.getsid(0)


# --- graceful stop --------------------------------------------------------------------------
async def _stop(target, **kw):
    return await stop_process(target, **kw)


@pytest.mark.anyio
async def test_stop_terminates_a_polite_child_and_reaps_it(tmp_path: Path, cleanup):
    pid = _spawn(tmp_path, POLITE)
    cleanup.append(pid)
    assert await _stop(SpawnedChild(pid), grace_s=10) == "terminated"
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left


@pytest.mark.anyio
async def test_stop_escalates_to_sigkill_for_a_child_ignoring_sigterm(tmp_path: Path, cleanup):
    pid = _spawn(tmp_path, STUBBORN, tag="stubborn")
    cleanup.append(pid)
    ident = ProcessIdentity(pid, birth_of(pid), args=(("--tag", "stubborn"),))
    assert await _stop(ident, grace_s=0.5, escalate=False) == "running"
    assert "term ignored" in (tmp_path / "child.log").read_text()
    assert await _stop(ident, grace_s=0.5) == "killed"
    assert is_gone(pid)


@pytest.mark.anyio
async def test_stop_refuses_an_unproven_process_and_leaves_it_running(tmp_path: Path, cleanup):
    pid = _spawn(tmp_path, POLITE, tag="real")
    cleanup.append(pid)
    with pytest.raises(ForbiddenError, match="refusing to signal"):
        await _stop(ProcessIdentity(pid, birth_of(pid), args=(("--tag", "x"),)), grace_s=1)
    assert not is_gone(pid)
    assert await _stop(SpawnedChild(pid), grace_s=10) == "terminated"
    assert await _stop(SpawnedChild(pid), grace_s=10) == "gone"


def test_sync_stop_for_cli_callers(tmp_path: Path, cleanup):
    pid = _spawn(tmp_path, POLITE)
    cleanup.append(pid)
    assert stop_process_sync(ProcessIdentity(pid, birth_of(pid)), grace_s=10) == "terminated"


# --- polling --------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_wait_until_returns_the_first_truthy_value_or_none_at_the_deadline():
    calls: list[int] = []

    def third() -> int:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    async def never() -> bool:
        return False

    assert await wait_until(third, timeout_s=30, interval_s=0.01) == 3
    assert await wait_until(never, timeout_s=0.05, interval_s=0.01) is None
    assert wait_until_sync(lambda: None, timeout_s=0.05, interval_s=0.01) is None


@pytest.mark.anyio
async def test_wait_until_reads_the_state_once_even_with_a_zero_budget():
    async def slow_reading() -> int:
        await anyio.sleep(0.05)  # like an HTTP probe: it must not be cancelled at once
        return 7

    assert await wait_until(slow_reading, timeout_s=0.0) == 7


@pytest.mark.anyio
async def test_wait_until_propagates_the_predicate_error():
    def boom() -> bool:
        raise StateError("child exited")

    with pytest.raises(StateError, match="child exited"):
        await wait_until(boom, timeout_s=30)


@pytest.mark.anyio
async def test_wait_until_lets_other_tasks_run():
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await wait_until(lambda: len(ticks) >= 5, timeout_s=30, interval_s=0.01)
        tg.cancel_scope.cancel()
    assert len(ticks) >= 5


# --- GRID_HOME ------------------------------------------------------------------------------
def test_grid_home_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GRID_HOME", str(tmp_path / "env"))
    assert grid_home() == tmp_path / "env"
    assert not (tmp_path / "env").exists()  # reading never creates
    assert grid_home(tmp_path / "cli", create=True) == tmp_path / "cli"
    assert stat.S_IMODE((tmp_path / "cli").stat().st_mode) == 0o700
    monkeypatch.delenv("GRID_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert grid_home() == tmp_path / "user" / ".grid"
