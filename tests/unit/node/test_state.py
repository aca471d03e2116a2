"""Durable node state: owner-only, atomic, locked, corrupt files refused, receipts bounded."""

from __future__ import annotations

import os
import resource
import signal
import stat

import pytest

from grid_core.errors import ConflictError, StateError
from grid_core.runtime import ChildRecord
from grid_core.wire import Acknowledgement
from grid_node.state import MAX_RECEIPTS, Receipt, StateFile


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_state_and_key_file_are_owner_only_and_survive_reload(tmp_path):
    store = StateFile(tmp_path / "node")
    state = store.load_or_create("host-a")
    state.children["m"] = ChildRecord(
        runtime="llama.cpp",
        model_id="m",
        alias="m",
        pid=123,
        port=22200,
        birth=1.5,
        executable="/bin/x",
    )
    store.save(state)
    assert mode(store.dir) == 0o700 and mode(store.path) == 0o600
    assert mode(store.key_path) == 0o600
    assert store.key_path.read_text().strip() == state.engine_api_key
    again = StateFile(tmp_path / "node").load_or_create()
    assert again.host_id == "host-a" and again.children["m"].birth == 1.5
    assert again.engine_api_key == state.engine_api_key  # the per-host key is stable
    assert [p.name for p in store.dir.iterdir() if p.name.startswith(".")] == []


def test_host_id_mismatch_is_refused(tmp_path):
    StateFile(tmp_path).load_or_create("host-a")
    with pytest.raises(ConflictError, match="belongs to host host-a"):
        StateFile(tmp_path).load_or_create("host-b")


def test_corrupt_state_is_refused_not_overwritten(tmp_path):
    store = StateFile(tmp_path)
    store.ensure_dir()
    store.path.write_text("{not json")
    with pytest.raises(StateError, match="corrupt"):
        store.load_or_create()
    assert store.path.read_text() == "{not json"


def test_failed_write_leaves_the_previous_state(tmp_path):
    store = StateFile(tmp_path / "n")
    state = store.load_or_create("host-a")
    before = store.path.read_bytes()
    # A real write failure: the file-size limit makes write(2) fail with EFBIG the way a
    # full disk fails with ENOSPC (SIGXFSZ is ignored so the process survives it).
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8, limits[1]))
    state.highest_term = 9
    try:
        with pytest.raises(StateError, match=r"node\.json"):
            store.save(state)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert store.path.read_bytes() == before
    assert sorted(p.name for p in store.dir.iterdir() if p.name.endswith(".tmp")) == []


def test_one_agent_per_state_directory(tmp_path):
    first, second = StateFile(tmp_path), StateFile(tmp_path)
    first.lock()
    try:
        with pytest.raises(ConflictError, match="another node agent"):
            second.lock()
    finally:
        first.unlock()
    second.lock()
    second.unlock()


def test_receipts_are_bounded_and_keep_undelivered_ones(tmp_path):
    state = StateFile(tmp_path).load_or_create("host-a")
    state.add_receipt(
        Receipt(ack=Acknowledgement(action_id="keep", status="failed"), kind="warm", model_id="m")
    )
    for i in range(MAX_RECEIPTS + 50):
        state.add_receipt(
            Receipt(
                ack=Acknowledgement(action_id=f"a{i}", status="succeeded"),
                kind="load",
                model_id="m",
                delivered=True,
            )
        )
    assert len(state.receipts) == MAX_RECEIPTS
    assert state.receipt("keep") is not None
