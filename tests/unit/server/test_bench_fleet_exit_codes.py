"""A wrong ``--fleet`` file for the benchmarks is operator input: one line, exit 2.

Runs the real ``grid`` entry point in process (``grid_core.cli.main``: the same error handling
and exit codes as the installed script, without a Python start-up per case).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grid_core.cli import main


@pytest.mark.parametrize("command", ["plan", "tick"])
@pytest.mark.parametrize("content", [None, "not json", '{"schema": "other/1"}'])
def test_missing_or_invalid_fleet_file_exits_2(
    tmp_path: Path, command: str, content: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.json"
    if content is not None:
        fleet.write_text(content)
    with pytest.raises(SystemExit) as exited:
        main(["bench", command, "--fleet", str(fleet)])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert err.strip().splitlines() == [err.strip()]
    assert str(fleet) in err
