"""Load generator processes for ``grid bench proxy`` (closed loop, HTTP/1.1 keep-alive).

Each generator is a separate process with its own event loop and aiohttp connection pool, so
the process measuring the proxy is never the one saturating first. The coordinator sends
one command per block over a pipe: target URL, headers, request count and concurrency; the
generator answers with per-request latencies (ms), the upstream time Grid reported for each
(its ``Server-Timing`` header, when present), its wall time and its own CPU seconds, so the
report can show that the generator had headroom.

Lifecycle: the processes are children of the coordinator, stopped by :meth:`Generators.close`
through their own handles; one whose coordinator died sees its pipe close and exits after its
current block (a block is a bounded number of requests, each with a bounded timeout).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import resource
import time
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from grid_server.bench_stats import parse_server_timing

REQUEST_TIMEOUT_S = 60.0
"""Longest one bench request may take: far above any proxied fake-engine reply, so only a
hung target reaches it (the block then fails instead of waiting for ever)."""
STOP_GRACE_S = 5.0
"""How long :meth:`Generators.close` waits for a generator to exit before killing it."""


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
    upstream_ms: list[float | None]
    """Per request, aligned with ``latencies_ms``: the ``Server-Timing: upstream;dur=`` value
    of the response (ms), ``None`` when the response carried none (a direct request)."""
    wall_s: float
    cpu_s: float
    failures: int
    first_failure: str | None = None


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _run_block(session: Any, block: Block) -> BlockResult:
    import asyncio

    import aiohttp

    latencies: list[float] = []
    upstream: list[float | None] = []
    failures = 0
    first: str | None = None
    left = block.requests

    async def worker() -> None:
        nonlocal left, failures, first
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            try:
                async with session.post(block.url, data=block.body, headers=block.headers) as r:
                    await r.read()
                    t1 = time.perf_counter()
                    if r.status != 200:
                        failures += 1
                        first = first or f"HTTP {r.status}"
                        continue
                    timing = r.headers.get("server-timing")
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures += 1
                first = first or f"{type(exc).__name__}: {exc}"
                continue
            latencies.append((t1 - t0) * 1000.0)
            upstream.append(parse_server_timing(timing))

    cpu0, t0 = _cpu_s(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(block.concurrency)))
    return BlockResult(
        latencies_ms=latencies,
        upstream_ms=upstream,
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
            connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        ) as session:
            loop = asyncio.get_running_loop()
            while True:
                try:
                    raw = await loop.run_in_executor(None, conn.recv_bytes)
                except (EOFError, OSError):
                    return  # the coordinator is gone: nothing to report to
                if raw == b"stop":
                    return
                block = msgspec.msgpack.decode(raw, type=Block)
                result = await _run_block(session, block)
                conn.send_bytes(msgspec.msgpack.encode(result))

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


class Sample(msgspec.Struct, frozen=True):
    """One block's measurements merged over the generators (ms, seconds)."""

    latencies_ms: list[float]
    upstream_ms: list[float | None]
    """Aligned with ``latencies_ms``; see :attr:`BlockResult.upstream_ms`."""
    wall_s: float
    """Wall time of the slowest generator."""
    cpu_s: float
    """CPU seconds of all generators together."""


class Generators:
    """A pool of generator processes (stopped by :meth:`close`; a context manager).

    Raises:
        RuntimeError: from :meth:`run` when a request failed or a generator died.
    """

    def __init__(self, processes: int) -> None:
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        try:
            for _ in range(processes):
                parent, child = ctx.Pipe()
                self._conns.append(parent)
                proc = ctx.Process(target=_serve, args=(child,), daemon=True)
                proc.start()
                child.close()
                self._procs.append(proc)
        except BaseException:
            self.close()  # the ones already started: no orphan on a failed start
            raise

    def __enter__(self) -> Generators:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """Process ids of the generator processes."""
        return [p.pid for p in self._procs]

    def run(self, block: Block) -> Sample:
        """Run ``block`` split across the generators at once.

        Raises:
            RuntimeError: a request failed (the bench refuses to report on errors), or a
                generator process died.
        """
        n = len(self._conns)
        conc = [block.concurrency // n + (1 if i < block.concurrency % n else 0) for i in range(n)]
        active = [i for i in range(n) if conc[i] > 0]
        share = [block.requests * conc[i] // block.concurrency for i in range(n)]
        share[active[0]] += block.requests - sum(share)
        for i in active:
            part = msgspec.structs.replace(block, requests=share[i], concurrency=conc[i])
            self._conns[i].send_bytes(msgspec.msgpack.encode(part))
        results: list[BlockResult] = []
        for i in active:
            try:
                raw = self._conns[i].recv_bytes()
            except (EOFError, OSError):
                code = self._procs[i].exitcode
                msg = f"load generator {self._procs[i].pid} died (exit code {code})"
                raise RuntimeError(msg) from None
            results.append(msgspec.msgpack.decode(raw, type=BlockResult))
        failures = sum(r.failures for r in results)
        if failures:
            first = next(r.first_failure for r in results if r.first_failure)
            msg = f"{failures} bench requests to {block.url} failed (first: {first})"
            raise RuntimeError(msg)
        return Sample(
            latencies_ms=[x for r in results for x in r.latencies_ms],
            upstream_ms=[x for r in results for x in r.upstream_ms],
            wall_s=max(r.wall_s for r in results),
            cpu_s=sum(r.cpu_s for r in results),
        )

    def close(self) -> None:
        """Stop every generator process this pool started."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"stop")
        for proc in self._procs:
            proc.join(timeout=STOP_GRACE_S)
            if proc.is_alive():
                proc.kill()  # our own child, by its handle
                proc.join(timeout=STOP_GRACE_S)
        for conn in self._conns:
            conn.close()
