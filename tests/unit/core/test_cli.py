"""The root ``grid`` command: exit codes and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def _run(args: list[str], pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_unknown_command_is_a_usage_error_exit_2() -> None:
    result = _run(["no-such-command"])
    assert result.returncode == 2
    assert "No such command" in result.stderr


def test_help_lists_plugin_contributed_groups() -> None:
    result = _run(["--help"])
    assert result.returncode == 0
    assert "plugins" in result.stdout


def test_handled_error_is_one_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "failing_cmd.py").write_text(
        textwrap.dedent('''
        from grid_core import hookimpl
        from grid_core.errors import NotFoundError

        def explode() -> None:
            """Fail the way a real command fails."""
            raise NotFoundError("model 'x' is not configured; run grid allocator model set x")

        @hookimpl
        def grid_cli_commands(cli):
            cli.command(explode, name="explode")
    ''')
    )
    info = tmp_path / "failing_cmd-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: failing-cmd\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[grid]\nfailing_cmd = failing_cmd\n")
    result = _run(["explode"], pythonpath=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "grid: error: model 'x' is not configured; run grid allocator model set x"
    ]
    assert "Traceback" not in result.stderr
