"""The load deadline comes from the controller, not a fixed adapter constant (issue 20).

A real node actuator and the real llama.cpp adapter (its own default deadline is 180 s) start
a FAKE llama-server (clearly named: a child process that never becomes ready). The warm
command carries the controller's readiness deadline, derived from the profile's warm estimate
and the learned warm time; the node must wait exactly that long, fail the warm with that
number in its acknowledgement, and leave no process behind.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest
from grid_llamacpp.adapter import READY_TIMEOUT_S, LlamaCppAdapter
from ports import port_range

from grid_core.nodeconfig import NodeConfig
from grid_core.protection import ProtectionDecision
from grid_core.runtime import LoadResult
from grid_core.system import is_gone
from grid_core.wire import Command
from grid_node.actuator import Actuator
from grid_node.state import StateFile

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

PORTS = port_range(22670, 22679)
"""Managed ports for the fake engine (docs/testing.md lists the block)."""
COMMAND_DEADLINE_S = 1.0
"""The controller's deadline in this test: far below the adapter's own 180 s default."""
ACCEPTING = ProtectionDecision(
    state="accepting", reason="", sensor_state="accepting", sensor_reason="", raw_state="accepting"
)
FAKE_ENGINE = f"""#!{sys.executable}
# FAKE llama-server for Grid's tests: starts, never answers readiness.
import time
while True:
    time.sleep(0.05)
"""


def _warm(ready_timeout_s: float | None) -> Command:
    return Command(
        action_id="warm-stub-1",
        kind="warm",
        node_id="host-a",
        model_id="stub.gguf",
        plan_generation="e:00000000000000000001:d",
        controller_term=1,
        controller_id="c1",
        executable=True,
        memory_mb=16,
        ready_timeout_s=ready_timeout_s,
    )


async def test_a_warm_waits_the_deadline_its_command_carries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    exe = tmp_path / "fake-llama-server"
    exe.write_text(FAKE_ENGINE)
    exe.chmod(0o755)
    model = tmp_path / "models" / "stub.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF stub: never read by the fake engine")
    config = NodeConfig(
        state_dir=tmp_path / "node", model_dirs=(model.parent,), port_range=PORTS, dedicated=True
    )
    store = StateFile(config.state_dir)
    state = store.load_or_create("host-a")
    state.artifacts["stub.gguf"] = LoadResult(
        model_id="stub.gguf", path=str(model), sha256=None, size_bytes=1
    )
    adapter = LlamaCppAdapter(str(exe), term_grace_s=1.0)
    assert adapter.ready_timeout_s == READY_TIMEOUT_S == 180.0
    act = Actuator(config=config, store=store, state=state, adapters={"llama.cpp": adapter})
    caplog.set_level(logging.INFO, logger="grid.node")
    ack = await act.execute(
        _warm(COMMAND_DEADLINE_S), deadline_mono=time.monotonic() + 60, decision=ACCEPTING
    )
    assert ack.status == "failed", ack
    assert "not ready after 1 s" in ack.message, ack.message
    child = state.children.get("stub.gguf")
    assert child is not None and child.state == "failed"
    assert is_gone(child.pid), f"fake engine pid {child.pid} was left running"
    # The agent's log says what it ran, for whom, and how it ended (agent.log in a daemon).
    lines = [r.getMessage() for r in caplog.records if r.name == "grid.node"]
    assert any(line.startswith("executing warm stub.gguf") and "term 1" in line for line in lines)
    assert any(line.startswith("warm stub.gguf: failed in 1.") for line in lines), lines
