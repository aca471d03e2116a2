"""Deadline polling: wait until a condition holds or a deadline passes.

The async form runs on anyio (a cancel scope with a deadline), so it never blocks the loop; the
synchronous twin exists only for callers that are synchronous themselves (CLI commands, test
helpers outside an event loop).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast, overload

import anyio

T = TypeVar("T")

DEFAULT_INTERVAL_S = 0.1
"""Seconds between checks: a local process or loopback server answers in far less, and ten
checks a second cost nothing measurable."""


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T]], *, timeout_s: float, interval_s: float = ...
) -> T | None: ...


@overload
async def wait_until(
    predicate: Callable[[], T], *, timeout_s: float, interval_s: float = ...
) -> T | None: ...


async def wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> T | None:
    """Call ``predicate`` every ``interval_s`` seconds until it returns a truthy value.

    ``predicate`` may be a plain or an async callable; an exception it raises ends the wait
    and propagates (that is how a caller aborts early, e.g. when a child exited). It runs at
    least once, to completion, even when ``timeout_s`` is 0 (so a zero budget still reads the
    current state); an await inside a later check is cancelled when the deadline passes.

    Args:
        predicate: the condition; its first truthy result is returned.
        timeout_s: seconds until the wait gives up (counted from the call).
        interval_s: seconds between checks.

    Returns:
        The first truthy result, or ``None`` when ``timeout_s`` passed first.
    """

    async def check() -> T:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        return cast(T, result)

    deadline = anyio.current_time() + timeout_s
    first = await check()
    if first:
        return first
    with anyio.CancelScope(deadline=deadline):
        while True:
            await anyio.sleep(interval_s)
            result = await check()
            if result:
                return result
    return None


def wait_until_sync(
    predicate: Callable[[], T],
    *,
    timeout_s: float,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> T | None:
    """Blocking twin of :func:`wait_until` for synchronous callers only (never in async code).

    Args:
        predicate: the condition; its first truthy result is returned. An exception it
            raises ends the wait and propagates.
        timeout_s: seconds until the wait gives up (the predicate runs at least once).
        interval_s: seconds between checks.

    Returns:
        The first truthy result, or ``None`` when ``timeout_s`` passed first.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(interval_s, left))
