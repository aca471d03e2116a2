"""Starting a node through the grid_node API: the daemon reads one configuration document."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from grid_core.cli import main
from grid_core.client import GridClient
from grid_core.nodeconfig import NodeConfig, load_config
from grid_node.launch import agent_record, agent_running, start_node, stop_node
from grid_node.state import StateFile
from grid_server.harness import start_server

pytestmark = pytest.mark.integration


def test_start_node_writes_the_document_and_the_daemon_reads_only_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_server(home)
    state_dir = tmp_path / "node"
    try:
        config = NodeConfig(
            state_dir=state_dir,
            grid_url=server.url,
            host_id="host-doc",
            dedicated=True,
            heartbeat_interval_s=0.5,
            model_dirs=(tmp_path / "models",),
            failure_domain="rack-7",
        )
        # On the Grid's own machine the agent mints its credential with the operator token.
        rec = start_node(config, env=dict(os.environ, GRID_HOME=str(home)))
        assert rec.registered and rec.host_id == "host-doc" and agent_running(state_dir)
        assert load_config(config.path) == config
        assert rec.pid is not None
        argv = psutil.Process(rec.pid).cmdline()
        assert argv[-4:] == ["--instance", rec.instance, "--config", str(config.path)]
        with GridClient(server.url) as client:
            nodes = client.status()["server"]["nodes"]
        assert [n["host_id"] for n in nodes if n["role"] == "allocator"] == ["host-doc"]
        lines = stop_node(state_dir)
        assert lines[0] == f"node agent pid {rec.pid} drained and stopped"
        assert not agent_running(state_dir)
        stopped = agent_record(state_dir)
        assert stopped is not None and stopped.state == "stopped"
    finally:
        if agent_running(state_dir):
            stop_node(state_dir)
        server.stop()


def rotate(state_dir: Path) -> int:
    """``grid allocator node rotate-engine-key`` for ``state_dir``; its exit code."""
    try:
        main(["allocator", "node", "rotate-engine-key", "--state-dir", str(state_dir)])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_engine_key_rotation_waits_for_stop_and_the_next_start_uses_the_new_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    server = start_server(home)
    state_dir = tmp_path / "node"
    env = dict(os.environ, GRID_HOME=str(home))
    config = NodeConfig(
        state_dir=state_dir,
        grid_url=server.url,
        host_id="host-rot",
        dedicated=True,
        heartbeat_interval_s=0.5,
        model_dirs=(tmp_path / "models",),
    )
    store = StateFile(state_dir)
    try:
        rec = start_node(config, env=env)
        first = store.load()
        assert first is not None
        key_file = store.key_path.read_bytes()
        assert rotate(state_dir) != 0  # the running agent keeps its key
        err = capsys.readouterr().err
        assert f"pid {rec.pid}" in err and "grid allocator node stop" in err
        # The running agent rewrites its own state (protection readings), so compare the key,
        # not the file's bytes: the refused rotation wrote neither the state's key nor the file.
        during = store.load()
        assert during is not None and during.engine_api_key == first.engine_api_key
        assert store.key_path.read_bytes() == key_file
        stop_node(state_dir)
        assert rotate(state_dir) == 0
        rotated = store.load()
        assert rotated is not None and rotated.engine_api_key != first.engine_api_key
        start_node(config, env=env)
        assert agent_running(state_dir)
        # The restarted agent loaded the new key and wrote it for its engines.
        again = store.load()
        assert again is not None and again.engine_api_key == rotated.engine_api_key
        assert store.key_path.read_text().strip() == rotated.engine_api_key
    finally:
        if agent_running(state_dir):
            stop_node(state_dir)
        server.stop()
