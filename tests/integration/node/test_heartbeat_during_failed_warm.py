"""A failing warm-up must not stall the node agent's heartbeats.

A real Grid server, a real in-process node agent and a real child process standing in for
llama-server (a FAKE engine, clearly named: it never becomes ready and ignores SIGTERM, so the
adapter has to wait out its whole SIGTERM grace before SIGKILL). While the adapter stops that
child, the agent must keep heartbeating: a blocking wait would freeze the event loop for the
whole grace period and the server would hear nothing from the host.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

import anyio
import pytest
from grid_llamacpp.adapter import LlamaCppAdapter
from ports import port_range

from grid_core import hookimpl
from grid_core.nodeconfig import NodeConfig
from grid_core.runtime import LoadResult
from grid_core.system import is_gone, wait_until
from grid_core.testing import plugins_with
from grid_core.wire import Command
from grid_node.agent import NodeAgent
from grid_server.harness import start_server

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

PORTS = port_range(22660, 22669)
"""Managed ports for the fake engine (apart from other tests' ranges)."""
HEARTBEAT_S = 0.2
"""A short heartbeat interval so that many beats fall inside the stop's grace period."""
TERM_GRACE_S = 3.0
"""The adapter's SIGTERM grace in this test: the fake child ignores SIGTERM, so the whole
grace passes before SIGKILL (about 15 heartbeat intervals)."""
MIN_BEATS_DURING_STOP = 5
"""Heartbeats that must reach the server while the failed child is being stopped: a third
of what the interval allows, so a loaded machine passes, while a blocked loop sends none."""
WAIT_S = 60.0
"""Upper bound for the agent to register on a busy machine (never asserted as a time)."""

FAKE_ENGINE = f"""#!{sys.executable}
# FAKE llama-server for Grid's tests: never answers readiness, ignores SIGTERM.
import signal, time
signal.signal(signal.SIGTERM, lambda *_: print(f"SIGTERM at {{time.time():.6f}}", flush=True))
print("fake llama-server: up, never ready", flush=True)
while True:
    time.sleep(0.05)
"""


class _FailingReadiness:
    """Inline plugin: the real llama.cpp adapter with a short readiness deadline."""

    def __init__(self, exe: Path) -> None:
        self.adapter = LlamaCppAdapter(str(exe), ready_timeout_s=1.0, term_grace_s=TERM_GRACE_S)

    @hookimpl
    def grid_runtime_adapters(self, register) -> None:
        register(self.adapter)


def _warm(host_id: str, model_id: str) -> Command:
    return Command(
        action_id=f"warm-{model_id}-1",
        kind="warm",
        node_id=host_id,
        model_id=model_id,
        plan_generation="epoch:00000000000000000001:digest",
        controller_term=1,
        controller_id="ctl-test",
        executable=True,
        memory_mb=16,
    )


async def test_heartbeats_keep_flowing_while_a_failed_warm_up_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = tmp_path / "fake-llama-server"
    exe.write_text(FAKE_ENGINE)
    exe.chmod(0o755)
    model = tmp_path / "models" / "stub.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF stub: never read by the fake engine")
    home = tmp_path / "home"
    server = start_server(home)
    monkeypatch.setenv("GRID_HOME", str(home))  # the agent mints its credential locally
    state_dir = tmp_path / "node"
    config = NodeConfig(
        state_dir=state_dir,
        grid_url=server.url,
        port_range=PORTS,
        model_dirs=(model.parent,),
        heartbeat_interval_s=HEARTBEAT_S,
        dedicated=True,
    )
    plugin = _FailingReadiness(exe)
    agent = NodeAgent(config, plugins_with(("fake-readiness", plugin)))
    beats: list[float] = []
    try:
        await agent.open()
        assert agent._client is not None

        async def record(request) -> None:
            if request.url.path.endswith(f"/nodes/ctl.{agent.state.host_id}/heartbeat"):
                beats.append(time.time())

        agent._client.http.event_hooks["request"].append(record)
        async with anyio.create_task_group() as tg:
            stop = asyncio.Event()
            tg.start_soon(agent.run, stop)
            assert await wait_until(lambda: agent.registered and len(beats) >= 2, timeout_s=WAIT_S)
            agent.state.artifacts["stub.gguf"] = LoadResult(
                model_id="stub.gguf", path=str(model), sha256=None, size_bytes=1
            )
            assert agent.decision is not None
            ack = await agent.actuator.execute(
                _warm(agent.state.host_id, "stub.gguf"),
                deadline_mono=time.monotonic() + WAIT_S,
                decision=agent.decision,
            )
            finished = time.time()
            stop.set()
        child = agent.state.children["stub.gguf"]
    finally:
        await agent.close()
        server.stop()
    assert ack.status == "failed" and "not ready" in ack.message, ack.message
    log = (state_dir / "logs" / f"llama-{child.port}.log").read_text()
    sigterm = re.search(r"SIGTERM at ([0-9.]+)", log)
    assert sigterm, f"the adapter never sent SIGTERM to the failed child; log: {log}"
    during = [t for t in beats if float(sigterm.group(1)) < t < finished]
    print(f"{len(during)} heartbeats while the failed child was stopped ({TERM_GRACE_S} s grace)")
    assert len(during) >= MIN_BEATS_DURING_STOP, (
        f"only {len(during)} heartbeat(s) reached the server while the failed child was "
        f"stopped ({TERM_GRACE_S} s grace, {HEARTBEAT_S} s interval): the event loop was blocked"
    )
    assert is_gone(child.pid) and child.state == "failed"
