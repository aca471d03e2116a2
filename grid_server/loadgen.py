"""Load generator processes for ``grid bench proxy`` (closed loop, HTTP/1.1 keep-alive).

Each generator is a separate process with its own event loop and aiohttp connection pool, so
the process measuring the proxy is never the one saturating first. The coordinator sends
one command per block over a pipe: target URL, headers, request count and concurrency; the
generator answers with per-request latencies (ms), its wall time and its own CPU seconds, so
the report can show that the generator had headroom.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import resource
import time
from multiprocessing.connection import Connection
from typing import Any

import msgspec


class Block(msgspec.Struct, frozen=True):
    """One block of closed-loop requests for one generator."""

    url: str
    headers: dict[str, str]
    body: bytes
    requests: int
    concurrency: int


class BlockResult(msgspec.Struct, frozen=True):
    """What one generator measured (latencies in ms, times in seconds)."""

    latencies_ms: list[float]
    wall_s: float
    cpu_s: float
    failures: int
    first_failure: str | None = None


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _run_block(session: Any, block: Block) -> BlockResult:
    import asyncio

    latencies: list[float] = []
    failures = 0
    first: str | None = None
    left = block.requests

    async def worker() -> None:
        nonlocal left, failures, first
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            async with session.post(block.url, data=block.body, headers=block.headers) as r:
                await r.read()
                if r.status != 200:
                    failures += 1
                    first = first or f"{r.status}"
                    continue
            latencies.append((time.perf_counter() - t0) * 1000.0)

    cpu0, t0 = _cpu_s(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(block.concurrency)))
    return BlockResult(
        latencies_ms=latencies,
        wall_s=time.perf_counter() - t0,
        cpu_s=_cpu_s() - cpu0,
        failures=failures,
        first_failure=first,
    )


def _serve(conn: Connection) -> None:
    """Generator process body: run blocks until told to stop (``None``)."""
    import asyncio

    import aiohttp

    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop_factory = asyncio.new_event_loop

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=60.0)
        ) as session:
            loop = asyncio.get_running_loop()
            while True:
                raw = await loop.run_in_executor(None, conn.recv_bytes)
                if raw == b"stop":
                    return
                block = msgspec.msgpack.decode(raw, type=Block)
                result = await _run_block(session, block)
                conn.send_bytes(msgspec.msgpack.encode(result))

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


class Generators:
    """A pool of generator processes (stopped by :meth:`close`, also on error)."""

    def __init__(self, processes: int) -> None:
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for _ in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child,), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    def run(self, block: Block) -> tuple[list[float], float, float, int]:
        """Run ``block`` split across the generators at once.

        Returns:
            (latencies ms, wall seconds of the slowest generator, generator CPU seconds,
            failures).

        Raises:
            RuntimeError: a request failed (the bench refuses to report on errors).
        """
        n = len(self._conns)
        conc = [block.concurrency // n + (1 if i < block.concurrency % n else 0) for i in range(n)]
        active = [i for i in range(n) if conc[i] > 0]
        share = [block.requests * conc[i] // block.concurrency for i in range(n)]
        share[active[0]] += block.requests - sum(share)
        for i in active:
            part = msgspec.structs.replace(block, requests=share[i], concurrency=conc[i])
            self._conns[i].send_bytes(msgspec.msgpack.encode(part))
        results = [
            msgspec.msgpack.decode(self._conns[i].recv_bytes(), type=BlockResult) for i in active
        ]
        failures = sum(r.failures for r in results)
        if failures:
            first = next(r.first_failure for r in results if r.first_failure)
            msg = f"{failures} bench requests to {block.url} failed (first: HTTP {first})"
            raise RuntimeError(msg)
        lat = [x for r in results for x in r.latencies_ms]
        return lat, max(r.wall_s for r in results), sum(r.cpu_s for r in results), failures

    def close(self) -> None:
        """Stop every generator process this pool started."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"stop")
        for proc in self._procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
