"""Running the shipped ``grid`` CLI against a test's own GRID_HOME (e2e helper)."""

from __future__ import annotations

import os
import subprocess
import sys
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
