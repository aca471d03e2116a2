"""A wrong ``--fleet`` file for the benchmarks is operator input: one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GRID_BIN = Path(sys.executable).parent / "grid"


@pytest.mark.parametrize("command", ["plan", "tick"])
@pytest.mark.parametrize("content", [None, "not json", '{"schema": "other/1"}'])
def test_missing_or_invalid_fleet_file_exits_2(
    tmp_path: Path, command: str, content: str | None
) -> None:
    fleet = tmp_path / "fleet.json"
    if content is not None:
        fleet.write_text(content)
    r = subprocess.run(
        [str(GRID_BIN), "bench", command, "--fleet", str(fleet)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert str(fleet) in r.stderr
