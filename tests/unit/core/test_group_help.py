"""Group help promises only what the group's commands do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GRID_BIN = Path(sys.executable).parent / "grid"


def test_engine_help_does_not_promise_missing_commands() -> None:
    r = subprocess.run(
        [str(GRID_BIN), "engine", "--help"], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    # The only engine command is 'install'; the summary must not offer an inspect verb.
    assert "install" in r.stdout
    assert "inspect" not in r.stdout.lower()
