"""``grid allocator node status|stop`` wording when nothing was started (real CLI, real files)."""

from __future__ import annotations

import pytest

from grid_core.cli import main


def test_status_without_an_agent_is_one_clear_line_and_exit_1(tmp_path, capsys):
    sdir = tmp_path / "node"
    with pytest.raises(SystemExit) as exc:
        main(["allocator", "node", "status", "--state-dir", str(sdir)])
    assert exc.value.code == 1
    out = capsys.readouterr()
    assert "None" not in out.out + out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1
    assert "no node agent" in lines[0] and str(sdir) in lines[0]
    assert "grid allocator node start" in lines[0]


def test_stop_without_state_says_nothing_to_stop(tmp_path, capsys):
    sdir = tmp_path / "node"
    main_exit = None
    try:
        main(["allocator", "node", "stop", "--state-dir", str(sdir)])
    except SystemExit as exc:
        main_exit = exc.code
    assert main_exit in (None, 0)
    assert capsys.readouterr().out.strip() == f"no node state in {sdir.resolve()}; nothing to stop"
