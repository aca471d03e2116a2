"""Moving controller state between the file store and etcd: the document arrives whole, the
term keeps growing (nodes reject lower terms), and a running controller blocks the move."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from etcd_process import EtcdServer

from grid_core.errors import ConflictError
from grid_core.store import state_digest
from grid_core.system.state_etcd import EtcdSettings, EtcdStateStore
from grid_server.store import copy_state, file_store


def test_file_to_etcd_and_back_keeps_the_document_and_the_term_rising(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    src = file_store(home)
    for _ in range(4):  # four takeovers on the file store: term 4
        src.acquire_lease("old-server", 0.0, 30)
        src.release_lease("old-server")
    term_on_file, _ = src.acquire_lease("old-server", 0.0, 30)
    src.save(b'{"doc": 1}', None)
    src.release_lease("old-server")

    etcd = EtcdStateStore(EtcdSettings.parse(etcd_server.state_store))
    try:
        copied, term = copy_state(src, etcd, now=0.0)
        assert copied == len(b'{"doc": 1}') and term >= term_on_file
        assert etcd.load() == b'{"doc": 1}'
        first_on_etcd, _ = etcd.acquire_lease("new-server", 0.0, 30)
        assert first_on_etcd > term_on_file  # nodes accept the etcd leader
        etcd.save(b'{"doc": 2}', state_digest(b'{"doc": 1}'))
        etcd.release_lease("new-server")

        # Back to the file store: the file already holds the older document.
        with pytest.raises(ConflictError, match="--force"):
            copy_state(etcd, src, now=0.0)
        copy_state(etcd, src, now=0.0, force=True)
        assert src.load() == b'{"doc": 2}'
        back, _ = src.acquire_lease("file-server-again", 0.0, 30)
        assert back > first_on_etcd
    finally:
        etcd.close()


def test_a_running_controller_blocks_the_copy(etcd_server: EtcdServer, tmp_path: Path) -> None:
    etcd = EtcdStateStore(EtcdSettings.parse(etcd_server.state_store))
    try:
        etcd.acquire_lease("live-server", 0.0, 30)
        etcd.save(b"{}", None)
        with pytest.raises(ConflictError, match="live-server"):
            copy_state(etcd, file_store(tmp_path / "home"), now=0.0)
        assert file_store(tmp_path / "home").load() is None
    finally:
        etcd.close()


def test_cli_copies_and_names_the_term(etcd_server: EtcdServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    src = file_store(home)
    src.acquire_lease("old", 0.0, 30)
    src.save(b'{"doc": "cli"}', None)
    src.release_lease("old")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    argv = [sys.executable, "-c", "from grid_core.cli import main; main()"]
    out = subprocess.run(
        [*argv, "allocator", "state", "copy", "--from", "file", "--to", etcd_server.state_store],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        "copied 14 bytes" in out.stdout and "terms continue above 2" in out.stdout
    )  # old 1, the copy 2
    again = subprocess.run(
        [*argv, "allocator", "state", "copy", "--from", "file", "--to", "file"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 2 and "same store" in again.stderr
