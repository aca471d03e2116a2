"""``grid bench proxy``: latency the proxy adds over calling the same FAKE engine directly.

Both paths run in one process against one fake engine, in alternating blocks so machine noise
hits them alike. Added latency is reported as p50/p99 of the proxied distribution minus the
same percentile of the direct one (milliseconds), with the throughput of each path.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import anyio
import httpx
import msgspec
import psutil
import typer

from grid_core.table import render_table
from grid_server.context import NO_DELAY
from grid_server.harness import GridClient, start_fake_engine, start_server

BENCH_MODEL = "bench-model"
BLOCK = 100
"""Requests per alternating block: long enough to amortize switching, short enough to mix."""
HEARTBEAT_EVERY_S = 15.0
"""Keeps the bench host's 60 s leases alive during a long run."""
BODY = msgspec.json.encode(
    {"model": BENCH_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "ping"}]}
)


class BenchResult(msgspec.Struct):
    """One concurrency level's numbers (latencies in ms, rates in requests/s)."""

    concurrency: int
    requests: int
    p50_added_ms: float
    p99_added_ms: float
    direct_rps: float
    proxy_rps: float
    direct_p50_ms: float
    proxy_p50_ms: float
    proxy_cpu_us_per_request: float
    """Server-process CPU (user+system) per proxied request, in microseconds: the hot
    path's cost independent of how busy the machine's scheduler is."""
    load_avg_1m: float
    """The machine's one-minute load average when this level finished (noise indicator)."""


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def _block(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    n: int,
    concurrency: int,
    out: list[float],
) -> float:
    """Send ``n`` requests with ``concurrency`` workers; returns wall seconds."""
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            r = await client.post(url, content=BODY, headers=headers)
            out.append((time.perf_counter() - t0) * 1000.0)
            if r.status_code != 200:
                msg = f"bench request to {url} failed with {r.status_code}: {r.text[:200]}"
                raise RuntimeError(msg)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return time.perf_counter() - t0


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def _measure(
    engine_url: str, key: str, grid_url: str, server_pid: int, requests: int, concurrency: int
) -> BenchResult:
    direct: list[float] = []
    proxied: list[float] = []
    direct_s = proxy_s = cpu_s = 0.0
    server = psutil.Process(server_pid)
    limits = httpx.Limits(
        max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2
    )
    transport = httpx.AsyncHTTPTransport(socket_options=NO_DELAY, limits=limits)
    async with httpx.AsyncClient(timeout=60.0, transport=transport, trust_env=False) as client:
        ctype = {"content-type": "application/json"}
        d_headers = {**ctype, "authorization": f"Bearer {key}"}
        # Warm both paths (connections, caches) before measuring.
        await _block(client, engine_url + "/v1/chat/completions", d_headers, 50, concurrency, [])
        await _block(client, grid_url + "/v1/chat/completions", ctype, 50, concurrency, [])
        done = 0
        while done < requests:
            n = min(BLOCK, requests - done)
            direct_s += await _block(
                client, engine_url + "/v1/chat/completions", d_headers, n, concurrency, direct
            )
            cpu0 = _cpu_s(server)
            proxy_s += await _block(
                client, grid_url + "/v1/chat/completions", ctype, n, concurrency, proxied
            )
            cpu_s += _cpu_s(server) - cpu0
            done += n
    return BenchResult(
        concurrency=concurrency,
        requests=requests,
        p50_added_ms=round(statistics.median(proxied) - statistics.median(direct), 3),
        p99_added_ms=round(_pct(proxied, 0.99) - _pct(direct, 0.99), 3),
        direct_rps=round(requests / direct_s, 1),
        proxy_rps=round(requests / proxy_s, 1),
        direct_p50_ms=round(statistics.median(direct), 3),
        proxy_p50_ms=round(statistics.median(proxied), 3),
        proxy_cpu_us_per_request=round(cpu_s / requests * 1e6, 1),
        load_avg_1m=round(os.getloadavg()[0], 2),
    )


def run_bench(requests: int, concurrencies: list[int]) -> list[BenchResult]:
    """Start a server and a fake engine, measure every concurrency, stop both."""
    with tempfile.TemporaryDirectory(prefix="grid-bench-") as tmp:
        work = Path(tmp)
        engine, key = start_fake_engine(work, BENCH_MODEL)
        server = None
        stop = threading.Event()
        try:
            server = start_server(work / "home")
            gc = GridClient(server.url, work / "home")
            token = gc.node_token("bench-host")

            def keep_alive() -> None:
                while not stop.is_set():
                    gc.register_host(token, "bench-host").raise_for_status()
                    gc.register_engine(
                        token, "bench-host", BENCH_MODEL, engine.url, key
                    ).raise_for_status()
                    stop.wait(HEARTBEAT_EVERY_S)

            beat = threading.Thread(target=keep_alive, daemon=True)
            beat.start()
            gc.wait_ready(BENCH_MODEL)
            results = [
                anyio.run(_measure, engine.url, key, server.url, server.proc.pid, requests, c)
                for c in concurrencies
            ]
            stop.set()
            beat.join()
            gc.close()
            return results
        finally:
            stop.set()
            if server is not None:
                server.stop()
            engine.stop()


def bench_proxy(
    requests: int = typer.Option(
        2000, "--requests", min=100, help="Requests per path per concurrency level."
    ),
    concurrency: list[int] = typer.Option(  # noqa: B008
        [1, 32],
        "--concurrency",
        help="Concurrency levels (repeatable).",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Measure the proxy's added latency against a FAKE engine called directly."""
    results = run_bench(requests, concurrency)
    if as_json:
        typer.echo(json.dumps({"results": msgspec.to_builtins(results)}, indent=2))
        return
    typer.echo(
        render_table(
            [
                "concurrency",
                "requests",
                "p50 added ms",
                "p99 added ms",
                "direct rps",
                "proxy rps",
                "direct p50 ms",
                "proxy p50 ms",
                "proxy cpu us/req",
                "load 1m",
            ],
            [
                [
                    r.concurrency,
                    r.requests,
                    r.p50_added_ms,
                    r.p99_added_ms,
                    r.direct_rps,
                    r.proxy_rps,
                    r.direct_p50_ms,
                    r.proxy_p50_ms,
                    r.proxy_cpu_us_per_request,
                    r.load_avg_1m,
                ]
                for r in results
            ],
        )
    )
