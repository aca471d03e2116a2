"""Fence a real llama-server engine while one request is provably still running on it.

The drain-in-flight tests need a request that is still running when the drain reads the
engine's slots. How long a request of N tokens runs depends on the machine: about 1 s for
300 tokens of the suites' tiny model on a quiet machine, nearly 2 minutes at a load average
of 25, and less than the drain's own reads on a fast CI machine. No single token count keeps
both ends inside their bounds, so :func:`drain_while_busy` starts modest and, only when the
request ended before the drain looked, restarts the engine and tries a longer one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx

from grid_core.system import wait_until

BUSY_TOKEN_STEPS = (300, 900, 1800)
"""Tokens of each attempt's long request (``ignore_eos``). The first ends inside the suites'
120 s command deadline even at ~3 tokens/s; the last fits the 2,048-token slot context of the
suites' 4,096-context model run with two slots (prompt included) and runs ~9 s when quiet."""
ENGINE_WAIT_S = 90.0
"""Bound for the engine to become idle or busy on a loaded 2-core machine (never asserted)."""
POLL_S = 0.05
"""Interval between reads of the engine's running requests (s)."""


@dataclass
class InFlight:
    """A long request the drain found running.

    Attributes:
        request: the task answering the request (await it for the response).
        tokens: the tokens it asked for (``ignore_eos``: the reply has exactly this many).
        drained: the fence-only drain's answer (it names the running requests).
        attempts: how many long requests it took (earlier ones ended before the drain).
    """

    request: asyncio.Task[httpx.Response]
    tokens: int
    drained: str
    attempts: int


async def drain_while_busy(
    send: Callable[[int], Coroutine[Any, Any, httpx.Response]],
    running: Callable[[], Awaitable[int | None]],
    drain: Callable[[], Awaitable[str]],
    restart: Callable[[], Awaitable[None]],
) -> InFlight:
    """Send a long request, wait until the engine runs it, then drain with no wait.

    Args:
        send: sends one request of the given token count and returns its response.
        running: the engine's running requests now (``None`` when it cannot say).
        drain: fences the route without waiting and returns the drain's answer.
        restart: brings a drained engine back to ready (unload, warm, route again).

    Returns:
        The request the drain reported running, with its token count.

    Raises:
        AssertionError: the engine never became idle or busy within :data:`ENGINE_WAIT_S`,
            a request that ended before the drain failed, or every attempt in
            :data:`BUSY_TOKEN_STEPS` ended before the drain looked.
    """
    answers: list[str] = []
    for attempt, tokens in enumerate(BUSY_TOKEN_STEPS, start=1):
        # llama-server answers a request before it releases the slot: wait for the slot of
        # anything sent before, so the busy read below sees this request, not that one.
        await _until(lambda: _is(running, idle=True), "the engine to become idle")
        request = asyncio.create_task(send(tokens))

        async def busy_or_done(request: asyncio.Task[httpx.Response] = request) -> bool:
            return request.done() or await _is(running, idle=False)

        await _until(busy_or_done, "the request to become active")
        drained = "the request ended before the engine was seen running it"
        if not request.done():
            drained = await drain()
            if "still running" in drained:
                return InFlight(request, tokens, drained, attempt)
        answers.append(drained)
        done = await request  # it ended before the drain looked: a fast machine
        assert done.status_code == 200, done.text
        await restart()
    msg = f"every long request {BUSY_TOKEN_STEPS} ended before the drain looked: {answers}"
    raise AssertionError(msg)


async def _is(running: Callable[[], Awaitable[int | None]], *, idle: bool) -> bool:
    n = await running()
    return n == 0 if idle else (n or 0) > 0


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    if not await wait_until(check, timeout_s=ENGINE_WAIT_S, interval_s=POLL_S):
        raise AssertionError(f"timed out waiting for {what}")
