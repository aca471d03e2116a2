"""Running the shipped ``grid`` CLI against a test's own GRID_HOME (e2e helper)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
