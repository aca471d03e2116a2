"""``grid bench proxy``: latency the proxy adds over calling the same FAKE engine directly.

Load comes from separate generator processes (:mod:`grid_server.loadgen`), so the process
that measures is never the one that saturates first; their CPU use is reported beside the
numbers. Direct and proxied requests run in alternating blocks so machine noise hits both
alike. Added latency is the proxied percentile minus the same percentile of the direct
distribution (milliseconds), with the throughput of each path (requests/s).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
from pathlib import Path

import msgspec
import psutil
import typer

from grid_core.table import render_table
from grid_server.harness import Testbed, start_fake_engine, start_server
from grid_server.loadgen import Block, Generators

BENCH_MODEL = "bench-model"
BLOCK = 500
"""Requests per alternating block: long enough to amortize switching, short enough to mix."""
WARMUP = 200
"""Requests per path before measuring (connections, caches)."""
GENERATOR_PROCESSES = 2
"""Load generator processes: one per core of a small machine; each drives half the clients."""
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
    direct_p99_ms: float
    proxy_p99_ms: float
    proxy_cpu_us_per_request: float
    """Server-process CPU (user+system) per proxied request, in microseconds: the hot
    path's cost independent of how busy the machine's scheduler is."""
    generator_cpu_pct: float
    """Average CPU use of each generator process during the proxied blocks (% of one core):
    well below 100 means the generator was not the bottleneck."""
    load_avg_1m: float
    """The machine's one-minute load average when this level finished (noise indicator)."""


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _measure(
    gens: Generators,
    engine_url: str,
    key: str,
    grid_url: str,
    server_pid: int,
    requests: int,
    concurrency: int,
) -> BenchResult:
    server = psutil.Process(server_pid)
    ctype = {"content-type": "application/json"}
    direct_block = Block(
        url=engine_url + "/v1/chat/completions",
        headers={**ctype, "authorization": f"Bearer {key}"},
        body=BODY,
        requests=0,
        concurrency=concurrency,
    )
    proxy_block = msgspec.structs.replace(
        direct_block, url=grid_url + "/v1/chat/completions", headers=ctype
    )
    warm = max(WARMUP, concurrency * 4)
    gens.run(msgspec.structs.replace(direct_block, requests=warm))
    gens.run(msgspec.structs.replace(proxy_block, requests=warm))
    direct: list[float] = []
    proxied: list[float] = []
    direct_s = proxy_s = cpu_s = gen_cpu_s = 0.0
    done = 0
    while done < requests:
        n = min(BLOCK, requests - done)
        lat, wall, _, _ = gens.run(msgspec.structs.replace(direct_block, requests=n))
        direct += lat
        direct_s += wall
        cpu0 = _cpu_s(server)
        lat, wall, gcpu, _ = gens.run(msgspec.structs.replace(proxy_block, requests=n))
        cpu_s += _cpu_s(server) - cpu0
        proxied += lat
        proxy_s += wall
        gen_cpu_s += gcpu
        done += n
    used = min(GENERATOR_PROCESSES, concurrency)
    return BenchResult(
        concurrency=concurrency,
        requests=requests,
        p50_added_ms=round(statistics.median(proxied) - statistics.median(direct), 3),
        p99_added_ms=round(_pct(proxied, 0.99) - _pct(direct, 0.99), 3),
        direct_rps=round(requests / direct_s, 1),
        proxy_rps=round(requests / proxy_s, 1),
        direct_p50_ms=round(statistics.median(direct), 3),
        proxy_p50_ms=round(statistics.median(proxied), 3),
        direct_p99_ms=round(_pct(direct, 0.99), 3),
        proxy_p99_ms=round(_pct(proxied, 0.99), 3),
        proxy_cpu_us_per_request=round(cpu_s / requests * 1e6, 1),
        generator_cpu_pct=round(gen_cpu_s / proxy_s / used * 100.0, 1),
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
            gc = Testbed(server.url, work / "home")
            token = gc.node_token("bench-host")

            def keep_alive() -> None:
                while not stop.is_set():
                    gc.register_host(token, "bench-host")
                    gc.register_engine(token, "bench-host", BENCH_MODEL, engine.url, key)
                    stop.wait(HEARTBEAT_EVERY_S)

            beat = threading.Thread(target=keep_alive, daemon=True)
            beat.start()
            gc.wait_ready(BENCH_MODEL)
            gens = Generators(GENERATOR_PROCESSES)
            try:
                results = [
                    _measure(gens, engine.url, key, server.url, server.pid, requests, c)
                    for c in concurrencies
                ]
            finally:
                gens.close()
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
        [1, 8, 32, 64],
        "--concurrency",
        help="Concurrency levels (repeatable).",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    tls: bool = typer.Option(
        False,
        "--tls",
        help="Instead: an engine behind TLS on a namespace link vs one on loopback (root).",
    ),
) -> None:
    """Measure the proxy's added latency against a FAKE engine called directly (or, with
    --tls, what an engine on another host behind TLS adds over one on loopback)."""
    if tls:
        _bench_tls(requests, concurrency, as_json)
        return
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
                "direct p99 ms",
                "proxy p99 ms",
                "proxy cpu us/req",
                "generator cpu %",
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
                    r.direct_p99_ms,
                    r.proxy_p99_ms,
                    r.proxy_cpu_us_per_request,
                    r.generator_cpu_pct,
                    r.load_avg_1m,
                ]
                for r in results
            ],
        )
    )


def _bench_tls(requests: int, concurrency: list[int], as_json: bool) -> None:
    from grid_core.errors import GridError
    from grid_server.bench_tls import run_tls_bench
    from grid_server.client import CliError

    try:
        results = run_tls_bench(requests, concurrency)
    except GridError as exc:
        raise CliError(str(exc), exc.exit_code) from None
    if as_json:
        typer.echo(json.dumps({"tls_results": msgspec.to_builtins(results)}, indent=2))
        return
    typer.echo(
        render_table(
            [
                "concurrency",
                "requests",
                "p50 added ms",
                "p99 added ms",
                "loopback p50 ms",
                "tls p50 ms",
                "loopback p99 ms",
                "tls p99 ms",
                "loopback rps",
                "tls rps",
                "load 1m",
            ],
            [
                [
                    r.concurrency,
                    r.requests,
                    r.p50_added_ms,
                    r.p99_added_ms,
                    r.loopback_p50_ms,
                    r.tls_p50_ms,
                    r.loopback_p99_ms,
                    r.tls_p99_ms,
                    r.loopback_rps,
                    r.tls_rps,
                    r.load_avg_1m,
                ]
                for r in results
            ],
        )
    )
    typer.echo(
        "added = proxied through Grid to an engine behind its node's TLS front on a namespace "
        "link, minus proxied to an engine on the server's loopback (same server, alternating "
        "blocks)"
    )
