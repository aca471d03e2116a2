"""``grid allocator state copy`` refuses while this Grid home's server runs and uses the
source or the target store (or does not say which store it uses); other copies go ahead.

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


def _running_server(home: Path, state_store: dict[str, object] | None) -> int:
    """Write a server record for this (live, provable) test process using ``state_store``."""
    me = psutil.Process()
    record = {
        "url": "http://127.0.0.1:1",
        "pid": me.pid,
        "create_time": me.create_time(),
        "cmdline": me.cmdline(),
        "state_store": state_store,
    }
    (home / SERVER_FILE).write_text(json.dumps(record))
    return me.pid


@pytest.fixture
def copied(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, object]]:
    """The stores ``copy_state`` was called with (the copy itself is tested elsewhere)."""
    import grid_server.store

    calls: list[tuple[object, object]] = []

    def fake_copy(source: object, target: object, **_: object) -> tuple[int, int]:
        calls.append((source, target))
        return 10, 3

    monkeypatch.setattr(grid_server.store, "copy_state", fake_copy)
    return calls


def _file_used(home: Path) -> dict[str, object]:
    return {"kind": "file", "path": str(file_store(home).path.resolve())}


def _etcd_used(prefix: str) -> dict[str, object]:
    return {"kind": "etcd", "endpoints": ["http://10.0.0.5:2379"], "prefix": prefix}


@pytest.mark.parametrize(
    ("used", "args"),
    [
        # A server on the default file store: etcd → etcd, and the file store of another dir.
        ("file", ("--from", "etcd://10.0.0.5:2379/a", "--to", "etcd://10.0.0.5:2379/b")),
        ("file", ("--from", "file", "--state-dir", "{other}", "--to", "etcd://10.0.0.5:2379")),
        # A server on etcd prefix /grid-prod/: the file store and another prefix.
        ("etcd", ("--from", "file", "--to", "etcd://10.0.0.5:2379/grid-test")),
    ],
)
def test_copy_between_stores_the_running_server_does_not_use_goes_ahead(
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    copied: list[tuple[object, object]],
    used: str,
    args: tuple[str, ...],
) -> None:
    _running_server(home, _file_used(home) if used == "file" else _etcd_used("/grid-prod/"))
    argv = [a.replace("{other}", str(tmp_path / "other")) for a in args]
    code, err = _state_copy(capsys, *argv)
    assert code == 0, err
    assert len(copied) == 1


@pytest.mark.parametrize(
    ("used", "args", "flag"),
    [
        ("file", ("--from", "file", "--to", "etcd://10.0.0.5:2379"), "--from"),
        ("file", ("--from", "etcd://10.0.0.5:2379", "--to", "file", "--force"), "--to"),
        ("file", ("--from", "file", "--state-dir", "{state}", "--to", "etcd://h:1"), "--from"),
        # Another name may reach the same etcd cluster: the same prefix counts as the same store.
        ("etcd", ("--from", "etcd://other-name:2379/grid-prod", "--to", "file"), "--from"),
        ("etcd", ("--from", "file", "--to", "etcds://10.0.0.5:2379/grid-prod/"), "--to"),
    ],
)
def test_copy_refuses_when_the_running_server_uses_either_store(
    home: Path,
    capsys: pytest.CaptureFixture[str],
    copied: list[tuple[object, object]],
    used: str,
    args: tuple[str, ...],
    flag: str,
) -> None:
    pid = _running_server(home, _file_used(home) if used == "file" else _etcd_used("/grid-prod/"))
    argv = [a.replace("{state}", str(home / "state")) for a in args]
    code, err = _state_copy(capsys, *argv)
    assert code == 2
    assert err.startswith(
        f"grid: error: a Grid server is running at http://127.0.0.1:1 (pid {pid})"
    )
    assert f"use the {flag} store" in err.replace("uses the", "use the")
    assert "grid down" in err
    assert copied == []


def test_copy_refuses_when_the_server_record_does_not_name_its_store(
    home: Path, capsys: pytest.CaptureFixture[str], copied: list[tuple[object, object]]
) -> None:
    """A server started by an earlier Grid does not record its store: it may use either."""
    _running_server(home, None)
    code, err = _state_copy(capsys, "--from", "etcd://h:1/a", "--to", "etcd://h:1/b")
    assert code == 2
    assert "does not say which state store it uses" in err
    assert copied == []
