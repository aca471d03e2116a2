"""Running the shipped ``grid`` CLI against a test's own GRID_HOME (e2e helper)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

CLI_TIMEOUT_S = 900
"""Start waits for registration and the baseline on two shared cores."""


def grid(
    home: Path, *args: str, timeout: float = CLI_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run ``grid *args`` with ``GRID_HOME=home``; output captured, exit code not checked."""
    env = dict(os.environ, GRID_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def owned(home: Path) -> list[psutil.Process]:
    """Processes whose command line names the fleet directory under ``home`` (this test's)."""
    marker = str(home / "fleet")
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or ()):
                out.append(p)
        except (psutil.Error, TypeError):
            continue
    return out


@contextmanager
def started_fleet(
    home: Path, *, machines: int, capacities_gib: str, engine_port_base: int
) -> Iterator[tuple[Path, str, str]]:
    """Start a logical fleet with ``grid test start`` under ``home``; yield (fleet root, URL,
    operator token); stop it with ``grid test stop`` and prove from the process table that
    no fleet process is left, including one started by hand (found by its GRID_HOME)."""
    from grid_fleet import layout
    from grid_fleet.lifecycle import fleet_processes

    from grid_core.system import is_gone, same_birth

    started = grid(
        home,
        "test",
        "start",
        "--machines",
        str(machines),
        "--text-capacities-gib",
        capacities_gib,
        "--port",
        "0",
        "--engine-port-base",
        str(engine_port_base),
    )
    root = home / "fleet"
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        rec = layout.load_record(root)
        assert rec is not None
        token = (root / "server" / "operator-token").read_text().strip()
        yield root, rec.url, token
    finally:
        before = [(p.pid, p.birth) for p in fleet_processes(root)]
        before += [(p.pid, p.create_time()) for p in owned(home)]
        stopped = grid(home, "test", "stop")
        left = [pid for pid, born in before if same_birth(pid, born) and not is_gone(pid)]
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not left, f"processes left after 'grid test stop': {left}"
        assert not owned(home) and not fleet_processes(root)
