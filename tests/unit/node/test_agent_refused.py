"""A node agent that a server refuses for its host id (409) stops acting instead of running
on as if it were the host's agent. The server is an in-memory HTTP stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from grid_core.client import AsyncGridClient
from grid_core.nodeconfig import NodeConfig
from grid_core.testing import plugins_with
from grid_node.agent import Credential, NodeAgent

pytestmark = pytest.mark.anyio

HOST = "host-05"
REFUSAL = "host id 'host-05' is in use by another node agent (instance bbbbbbbbbbbb)"
WAIT_S = 30.0
"""Upper bound for the agent loop to end by itself (never asserted as a time)."""


class StandIn:
    """Answers registrations and heartbeats like a server; after ``refuse_after`` accepted
    control heartbeats it answers 409 to everything, and it records what the agent sent."""

    def __init__(self, refuse_after: int | None) -> None:
        self.refuse_after = refuse_after
        self.beats = 0
        self.sent: list[tuple[str, str, dict[str, object] | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.sent.append((request.method, request.url.path, body))
        if self.refuse_after is not None and self.beats >= self.refuse_after:
            return httpx.Response(409, json={"error": {"message": REFUSAL}})
        if request.method == "PUT":
            return httpx.Response(
                200,
                json={"node_id": f"ctl.{HOST}", "host_id": HOST, "role": "allocator",
                      "ttl_seconds": 60.0, "rejected_rows": []},
            )  # fmt: skip
        if request.url.path.endswith("/heartbeat") and body and body.get("request_commands"):
            self.beats += 1
        return httpx.Response(200, json={"ttl_seconds": 60.0})


@contextlib.asynccontextmanager
async def refused_agent(tmp_path: Path, server: StandIn) -> AsyncIterator[NodeAgent]:
    """An agent run against ``server`` until its loop ends by itself; closed on exit."""
    config = NodeConfig(
        state_dir=tmp_path / "node",
        grid_url="http://127.0.0.1:9",
        host_id=HOST,
        heartbeat_interval_s=0.1,
        dedicated=True,
        model_dirs=(tmp_path / "models",),
    )
    agent = NodeAgent(config, plugins_with(), instance="a" * 32)
    await agent.open()
    agent.credential = Credential(token="stand-in", host_id=HOST)
    session = agent.sessions[0]
    await session.client.aclose()
    session.client = AsyncGridClient(
        config.grid_url,
        node_token="stand-in",
        http=httpx.AsyncClient(transport=httpx.MockTransport(server)),
    )
    try:
        await asyncio.wait_for(agent.run(asyncio.Event()), timeout=WAIT_S)
        yield agent
    finally:
        await agent.close()


async def run_until_refused(tmp_path: Path, server: StandIn) -> NodeAgent:
    async with refused_agent(tmp_path, server) as agent:
        return agent


async def test_a_superseded_agent_stops_its_loop_with_the_servers_reason(
    tmp_path: Path,
) -> None:
    server = StandIn(refuse_after=2)
    agent = await run_until_refused(tmp_path, server)
    assert REFUSAL in agent.refused and REFUSAL in agent.last_error
    assert agent.ever_registered  # the daemon then stops its engines (graceful stop)
    sent = [body for _m, _p, body in server.sent if body is not None]
    assert sent and all(b.get("instance_id") == "a" * 32 for b in sent)
    record = json.loads((tmp_path / "node" / "agent.json").read_text())
    assert REFUSAL in record["last_error"] and not record["ready"]


async def test_an_agent_refused_at_its_first_registration_never_counts_as_registered(
    tmp_path: Path,
) -> None:
    server = StandIn(refuse_after=0)
    agent = await run_until_refused(tmp_path, server)
    assert REFUSAL in agent.refused
    assert not agent.ever_registered and not agent.registered
    assert [(m, p) for m, p, _b in server.sent] == [("PUT", f"/nodes/ctl.{HOST}")]


async def test_a_superseded_agent_sends_nothing_more_while_it_stops(tmp_path: Path) -> None:
    # Every further report of a superseded run is refused too; sending them only fills the
    # server's refusal list with duplicates of one event.
    server = StandIn(refuse_after=2)
    async with refused_agent(tmp_path, server) as agent:
        refused_at = len(server.sent)
        await agent.shutdown(idle_wait_s=0.0)
    assert agent.refused
    assert server.sent[refused_at:] == []
