"""``grid allocator node rotate-engine-key``: a fresh key in the owner-only state, never shown,
refused (nothing written) while an agent holds the directory, on a directory without a node,
and while engines started with the current key are recorded (real CLI, real files, real lock)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from grid_core.cli import main
from grid_core.runtime import ChildRecord
from grid_node.state import ENGINE_KEY_BYTES, StateFile


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def snapshot(sdir: Path) -> dict[str, bytes]:
    """Every file of ``sdir`` by name with its bytes (empty when the directory is absent)."""
    if not sdir.exists():
        return {}
    return {p.name: p.read_bytes() for p in sdir.iterdir()}


def rotate(sdir: Path, *extra: str) -> int:
    try:
        main(["allocator", "node", "rotate-engine-key", "--state-dir", str(sdir), *extra])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def child(model_id: str, **fields: object) -> ChildRecord:
    return ChildRecord(
        runtime="llama.cpp", model_id=model_id, alias=model_id, pid=123, port=22200, **fields
    )


def test_rotation_replaces_the_key_owner_only_and_never_prints_it(tmp_path, capsys):
    sdir = tmp_path / "node"
    store = StateFile(sdir)
    before = store.load_or_create("host-r")
    before.highest_term = 7
    store.save(before)
    assert rotate(sdir) == 0
    out = capsys.readouterr()
    after = StateFile(sdir).load()
    assert after is not None
    assert after.engine_api_key != before.engine_api_key
    assert len(after.engine_api_key) >= ENGINE_KEY_BYTES  # urlsafe base64 of 32 random bytes
    assert after.host_id == "host-r" and after.highest_term == 7  # nothing else changed
    assert store.key_path.read_text().strip() == after.engine_api_key
    assert mode(sdir) == 0o700 and mode(store.path) == 0o600 and mode(store.key_path) == 0o600
    for key in (before.engine_api_key, after.engine_api_key):
        assert key not in out.out + out.err
    assert "host-r" in out.out
    # The restart hint names this node's state dir and its saved options, not the default node.
    assert f"grid allocator node start --state-dir {sdir} --config {sdir}/node-config.json" in (
        " ".join(out.out.split())
    )
    assert [p.name for p in sdir.iterdir() if p.name.startswith(".")] == []


def test_json_names_the_host_and_not_the_key(tmp_path, capsys):
    sdir = tmp_path / "node"
    StateFile(sdir).load_or_create("host-j")
    assert rotate(sdir, "--json") == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc == {
        "state_dir": str(sdir.resolve()),
        "host_id": "host-j",
        "engine_key_rotated": True,
    }
    state = StateFile(sdir).load()
    assert state is not None and state.engine_api_key not in out


def test_refused_while_an_agent_holds_the_state_directory(tmp_path, capsys):
    sdir = tmp_path / "node"
    StateFile(sdir).load_or_create("host-l")
    agent = StateFile(sdir)
    agent.lock()  # the instance lock, taken exactly as the node agent takes it at open
    try:
        before = snapshot(sdir)
        assert rotate(sdir) != 0
        assert snapshot(sdir) == before
    finally:
        agent.unlock()
    err = capsys.readouterr().err
    assert "a node agent is running" in err and "grid allocator node stop" in err
    assert str(sdir.resolve()) in err


@pytest.mark.parametrize("made", [False, True], ids=["absent", "empty"])
def test_refused_on_a_state_directory_without_a_node(tmp_path, capsys, made):
    sdir = tmp_path / "nothing-here"
    if made:
        sdir.mkdir()
    assert rotate(sdir) != 0
    assert sdir.exists() is made and snapshot(sdir) == {}
    err = capsys.readouterr().err
    assert "no node agent in --state-dir" in err and "grid allocator node start" in err


def test_refused_with_a_configuration_but_no_node_state(tmp_path, capsys):
    sdir = tmp_path / "node"
    sdir.mkdir(mode=0o700)
    (sdir / "node-config.json").write_text("{}")
    assert rotate(sdir) != 0
    assert snapshot(sdir) == {"node-config.json": b"{}"}
    assert "no node state in" in capsys.readouterr().err


def test_refused_while_the_state_records_engines_started_with_the_key(tmp_path, capsys):
    sdir = tmp_path / "node"
    store = StateFile(sdir)
    state = store.load_or_create("host-c")
    state.children["m-ready"] = child("m-ready", state="ready")
    store.save(state)
    before = snapshot(sdir)
    assert rotate(sdir) != 0
    assert snapshot(sdir) == before
    err = capsys.readouterr().err
    assert "m-ready" in err and "grid allocator node stop" in err
    assert state.engine_api_key not in err


def test_a_fenced_child_does_not_block_rotation(tmp_path):
    sdir = tmp_path / "node"
    store = StateFile(sdir)
    state = store.load_or_create("host-f")
    state.children["m-fenced"] = child(
        "m-fenced", state="failed", failure="fenced after restart: identity not proven"
    )
    store.save(state)
    assert rotate(sdir) == 0
    after = StateFile(sdir).load()
    assert after is not None and after.engine_api_key != state.engine_api_key
    assert list(after.children) == ["m-fenced"]
