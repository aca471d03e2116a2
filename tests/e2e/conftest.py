"""Fixtures for end-to-end tests with real llama-server children.

``make test`` installs llama-server first (``grid engine install llama.cpp``); a missing binary
is a failure with the install hint, never a skip.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from grid_llamacpp.adapter import LlamaCppAdapter
from grid_llamacpp.install import find_llama_server
from grid_llamacpp.tinymodel import TinyModelSpec, make_model
from netns import netlab as netlab  # the namespace lab fixture (tests/support/netns.py)
from ports import port_range

from grid_core.nodeconfig import NodeConfig
from grid_core.system import ProcessIdentity, stop_process
from grid_core.wire import Command
from grid_node.actuator import Actuator
from grid_node.state import StateFile

E2E_PORTS = port_range(22400, 22499)
"""Ports for e2e children: apart from the default managed range used by a developer's node."""


@pytest.fixture(scope="session")
def llama_server() -> Path:
    return find_llama_server()


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    make_model(d / "tiny.gguf", TinyModelSpec(name="tiny", seed=1))
    # Slow enough (~250 tokens/s on 2 cores) that a request can be caught in flight.
    make_model(
        d / "mid.gguf", TinyModelSpec(name="mid", embedding=256, layers=4, context=4096, seed=2)
    )
    return d


@dataclass
class Node:
    """An actuator wired like the node agent does, plus helpers to build commands."""

    config: NodeConfig
    store: StateFile
    act: Actuator
    seq: int = 0

    def command(self, kind: str, model_id: str, **kw: object) -> Command:
        self.seq += 1
        fields = {
            "action_id": f"{kind}-{model_id}-{self.seq}",
            "kind": kind,
            "node_id": self.act.state.host_id,
            "model_id": model_id,
            "plan_generation": f"epoch:{self.seq:020d}:digest",
            "controller_term": 1,
            "controller_id": "ctl-A",
            "executable": True,
            "memory_mb": 64,
            **kw,
        }
        return Command(**fields)

    def restart(self) -> Actuator:
        """A fresh actuator from the durable state only (like a new agent process)."""
        store = StateFile(self.config.state_dir)
        state = store.load()
        assert state is not None
        self.act = Actuator(
            config=self.config,
            store=store,
            state=state,
            adapters={"llama.cpp": LlamaCppAdapter(parallel=2)},
        )
        return self.act


LEFTOVER_GRACE_S = 2.0
"""Seconds a leftover engine gets after SIGTERM at teardown (idle llama-server exits at once)."""


async def _stop_leftovers(state_dir: Path) -> None:
    """Stop every child this test's state recorded that is provably still ours."""
    store = StateFile(state_dir)
    with contextlib.suppress(Exception):
        state = store.load()
        for child in state.children.values() if state else ():
            ident = ProcessIdentity(child.pid, child.birth, args=(("--port", str(child.port)),))
            if ident.prove().status == "proven":
                await stop_process(ident, grace_s=LEFTOVER_GRACE_S)


@pytest.fixture
async def node(tmp_path: Path, models_dir: Path, llama_server: Path) -> AsyncIterator[Node]:
    config = NodeConfig(
        state_dir=tmp_path / "node",
        model_dirs=(models_dir,),
        port_range=E2E_PORTS,
        llama_server=str(llama_server),
    )
    store = StateFile(config.state_dir)
    state = store.load_or_create("host-e2e")
    act = Actuator(
        config=config, store=store, state=state, adapters={"llama.cpp": LlamaCppAdapter(parallel=2)}
    )
    n = Node(config=config, store=store, act=act)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    try:
        yield n
    finally:
        await _stop_leftovers(config.state_dir)
        # Last resort for a test that failed between spawning an engine and recording it: only
        # processes this test process started during the test (descendants that did not exist
        # before it), matched by PID and ancestry, never by name.
        for p in me.children(recursive=True):
            if p.pid not in before:
                with contextlib.suppress(psutil.Error):
                    p.kill()
                    p.wait(10)


@pytest.fixture
def sleeper() -> Iterator[psutil.Popen]:
    """An unrelated process (not an engine) for identity tests."""
    proc = psutil.Popen(["sleep", "120"])
    try:
        yield proc
    finally:
        with contextlib.suppress(psutil.Error):
            proc.kill()
            proc.wait(10)
