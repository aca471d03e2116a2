"""A hung engine (SIGSTOP) on a real llama-server child: detected, taken out of routing,
force-stopped by proven identity, and its callers released long before any read timeout."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest
from test_llama_lifecycle import key, run, wait_busy

from grid_core.system import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

HUNG_AFTER_S = 3.0
"""The node's hung threshold for this test (the default is 15 s); the behaviour is the same."""
DETECT_WAIT_S = 120.0
"""Upper bound for detection plus the force stop on a loaded 2-core machine (never asserted
as a timing: it only bounds the wait so a regression fails instead of hanging)."""


async def test_hung_engine_detected_out_of_routing_replaced_and_force_stopped(node):
    load = await run(node, "load", "mid.gguf")
    warm = await run(node, "warm", "mid.gguf", dependencies=[load.action_id])
    assert warm.status == "succeeded", warm.message
    act = node.act
    act.hung_after_s = HUNG_AFTER_S
    child = act.state.children["mid.gguf"]
    pid, identity = child.pid, act.adapter_for("llama.cpp").identity(child)
    await act.refresh()
    assert act.probes["mid.gguf"].ready

    # A caller is being served when the engine hangs.
    async def caller() -> str:
        # ignore_eos: the tiny random model may otherwise end its reply before the 50 ms
        # activity poll sees it, and the test would wait for a request that is already over.
        body = {
            "messages": [{"role": "user", "content": "count"}],
            "max_tokens": 400,
            "ignore_eos": True,
        }
        async with httpx.AsyncClient(timeout=600.0) as client:
            try:
                r = await client.post(
                    f"{child.url}/v1/chat/completions", json=body, headers=key(node)
                )
            except httpx.TransportError as exc:
                return type(exc).__name__
            return str(r.status_code)

    request = asyncio.create_task(caller())
    await wait_busy(node, child)
    os.kill(pid, signal.SIGSTOP)
    hung_at = time.monotonic()

    # The agent's heartbeat loop calls refresh(); a stopped engine fails every readiness probe.
    async def declared_hung() -> bool:
        await act.refresh()
        c = act.state.children.get("mid.gguf")
        return c is None or c.state == "failed"

    assert await wait_until(declared_hung, timeout_s=DETECT_WAIT_S, interval_s=0.5)
    rows = {r.model_id: r for r in act.residencies()}
    # Out of routing: no longer ready, no route URL (or gone altogether once stopped).
    assert "mid.gguf" not in rows or (
        rows["mid.gguf"].state == "failed" and rows["mid.gguf"].route_url is None
    )

    # Force-stopped by proven identity; the record is released so a warm can replace it.
    async def released() -> bool:
        return "mid.gguf" not in act.state.children

    assert await wait_until(released, timeout_s=DETECT_WAIT_S, interval_s=0.2)
    assert identity.prove().status == "dead"
    outcome = await asyncio.wait_for(request, timeout=DETECT_WAIT_S)
    released_after = time.monotonic() - hung_at
    print(f"hung engine: caller released after {released_after:.1f} s ({outcome})")
    assert outcome != "200"  # it was cut by the stop, not answered by a stopped process
    assert any("hung" in e for e in act.events)

    # The replacement: the same host can warm the model again at once.
    again = await run(node, "warm", "mid.gguf")
    assert again.status == "succeeded", again.message
