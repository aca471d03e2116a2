"""``grid allocator state copy`` refuses while this Grid home's server runs.

A server in observe or recommend mode holds no single-writer lease, so the lease taken by the
copy does not notice it: without this check its state was copied while it kept changing.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from grid_core.cli import main
from grid_server.home import SERVER_FILE
from grid_server.store import file_store


def _state_copy(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(["allocator", "state", "copy", *args])
    return int(exc.value.code or 0), capsys.readouterr().err


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Grid home whose file store holds a controller document."""
    home = tmp_path / "home"
    monkeypatch.setenv("GRID_HOME", str(home))
    store = file_store(home)
    store.acquire_lease("old", 0.0, 30)
    store.save(b'{"doc": 1}', None)
    store.release_lease("old")
    return home


def test_copy_refuses_while_this_homes_server_runs(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    me = psutil.Process()  # stands in for the server: a live, provable process
    record = {
        "url": "http://127.0.0.1:1",
        "pid": me.pid,
        "create_time": me.create_time(),
        "cmdline": me.cmdline(),
    }
    (home / SERVER_FILE).write_text(json.dumps(record))
    code, err = _state_copy(capsys, "--from", "file", "--to", "etcd://127.0.0.1:1")
    assert code == 2
    assert err.startswith(
        f"grid: error: a Grid server is running at http://127.0.0.1:1 (pid {me.pid})"
    )
    assert "grid down" in err


def test_a_bad_store_names_the_flag_that_gave_it(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _state_copy(capsys, "--from", "file", "--to", "bogus")
    assert code == 2
    assert err.startswith("grid: error: --to 'bogus': expected 'file' or etcd://")
