"""``grid bench proxy``: latency the proxy adds over calling the same FAKE engine directly.

Load comes from separate generator processes (:mod:`grid_server.loadgen`), so the process
that measures is never the one that saturates first; their CPU use is reported beside the
numbers, and the direct path's rate shows what the generators and the engine manage without
Grid. Each concurrency level runs several rounds; a round is one block straight to the
engine and one through Grid, their order alternating from round to round, so a drift in the
machine's load hits both paths alike. Every figure is the median round with the lowest and
highest round beside it (:mod:`grid_server.bench_stats` says how "added" is measured).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import msgspec
import psutil
import typer

from grid_core.table import render_table
from grid_server.bench_stats import (
    PERCENTILES,
    BenchStatsError,
    RoundPath,
    Spread,
    interleaved_order,
    paired_added,
    percentile,
    round_path,
    spread,
)
from grid_server.loadgen import Block, Generators

BENCH_MODEL = "bench-model"
DEFAULT_ROUNDS = 5
"""Interleaved rounds per level: an odd count so the median is one real round, and enough
that one disturbed round (another job's burst on a shared machine) shows as spread instead
of moving the median."""
MIN_REQUESTS_PER_ROUND = 100
"""Below this a round's p99 rests on a single request."""
WARMUP = 200
"""Requests per path before measuring (connections, caches)."""
GENERATOR_PROCESSES = 2
"""Load generator processes: one per core of a small machine; each drives half the clients."""
GENERATOR_BUSY_PCT = 80.0
"""A generator busier than this (% of one core) may have limited the rate it measured: the
report says so instead of presenting its numbers as the proxy's."""
HEARTBEAT_EVERY_S = 15.0
"""Keeps the bench host's 60 s leases alive during a long run."""
BODY = msgspec.json.encode(
    {"model": BENCH_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "ping"}]}
)


class BenchResult(msgspec.Struct):
    """One concurrency level's numbers (latencies in ms, rates in requests/s).

    Every :class:`Spread` is the median round with the lowest and highest round.
    """

    concurrency: int
    requests: int
    """Requests per path over all rounds."""
    rounds: int
    proxy_rps: Spread
    direct_rps: Spread
    added_p50_ms: Spread
    """Paired, per request: latency through Grid minus the upstream time Grid reported."""
    added_p95_ms: Spread
    added_p99_ms: Spread
    proxy_minus_direct_p50_ms: Spread
    """Unpaired: proxied percentile minus direct percentile, per round (may cross zero)."""
    proxy_minus_direct_p95_ms: Spread
    proxy_minus_direct_p99_ms: Spread
    proxy_minus_direct_noise: dict[str, bool]
    """Per percentile (p50/p95/p99): the unpaired difference is within noise (not every
    round found it positive), so it is no figure to quote."""
    direct_p50_ms: Spread
    direct_p95_ms: Spread
    direct_p99_ms: Spread
    proxy_p50_ms: Spread
    proxy_p95_ms: Spread
    proxy_p99_ms: Spread
    proxy_cpu_us_per_request: float
    """Server-process CPU (user+system) per proxied request, in microseconds: the hot
    path's cost independent of how busy the machine's scheduler is."""
    generator_cpu_pct: float
    """Highest average CPU use of one generator process in any proxied block (% of one
    core): well below 100 means the generator was not the bottleneck."""
    generator_busy: bool
    """A generator exceeded :data:`GENERATOR_BUSY_PCT`: its rate may be the generator's."""
    load_avg: tuple[float, float, float]
    """The machine's 1/5/15-minute load average when this level finished."""


class RoundMeasure(msgspec.Struct):
    """One round of one level: both paths' figures and the paired added percentiles (ms)."""

    direct: RoundPath
    proxy: RoundPath
    added: dict[str, float]
    proxy_cpu_s: float
    generator_cpu_pct: float


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def summarise(concurrency: int, requests: int, rounds: list[RoundMeasure]) -> BenchResult:
    """Fold a level's rounds into medians with their spread (pure; see bench_stats)."""

    def over(pick: object) -> Spread:
        assert callable(pick)
        return spread([pick(r) for r in rounds])

    diff = {
        name: over(lambda r, n=name: getattr(r.proxy, f"{n}_ms") - getattr(r.direct, f"{n}_ms"))
        for name in PERCENTILES
    }
    generator_pct = max(r.generator_cpu_pct for r in rounds)
    return BenchResult(
        concurrency=concurrency,
        requests=requests,
        rounds=len(rounds),
        proxy_rps=spread([r.proxy.rps for r in rounds], 1),
        direct_rps=spread([r.direct.rps for r in rounds], 1),
        added_p50_ms=over(lambda r: r.added["p50"]),
        added_p95_ms=over(lambda r: r.added["p95"]),
        added_p99_ms=over(lambda r: r.added["p99"]),
        proxy_minus_direct_p50_ms=diff["p50"],
        proxy_minus_direct_p95_ms=diff["p95"],
        proxy_minus_direct_p99_ms=diff["p99"],
        proxy_minus_direct_noise={name: d.within_noise for name, d in diff.items()},
        direct_p50_ms=over(lambda r: r.direct.p50_ms),
        direct_p95_ms=over(lambda r: r.direct.p95_ms),
        direct_p99_ms=over(lambda r: r.direct.p99_ms),
        proxy_p50_ms=over(lambda r: r.proxy.p50_ms),
        proxy_p95_ms=over(lambda r: r.proxy.p95_ms),
        proxy_p99_ms=over(lambda r: r.proxy.p99_ms),
        proxy_cpu_us_per_request=round(sum(r.proxy_cpu_s for r in rounds) / requests * 1e6, 1),
        generator_cpu_pct=round(generator_pct, 1),
        generator_busy=generator_pct > GENERATOR_BUSY_PCT,
        load_avg=_load_avg(),
    )


def _load_avg() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return (round(one, 2), round(five, 2), round(fifteen, 2))


def _measure(
    gens: Generators,
    engine_url: str,
    key: str,
    grid_url: str,
    server_pid: int,
    requests: int,
    concurrency: int,
    rounds: int,
) -> BenchResult:
    server = psutil.Process(server_pid)
    ctype = {"content-type": "application/json"}
    blocks = {
        "direct": Block(
            url=engine_url + "/v1/chat/completions",
            headers={**ctype, "authorization": f"Bearer {key}"},
            body=BODY,
            requests=0,
            concurrency=concurrency,
        ),
        "proxy": Block(
            url=grid_url + "/v1/chat/completions",
            headers=ctype,
            body=BODY,
            requests=0,
            concurrency=concurrency,
        ),
    }
    warm = max(WARMUP, concurrency * 4)
    for block in blocks.values():
        gens.run(msgspec.structs.replace(block, requests=warm))
    used = min(GENERATOR_PROCESSES, concurrency)
    measured: list[RoundMeasure] = []
    per_round = [requests // rounds + (1 if i < requests % rounds else 0) for i in range(rounds)]
    for n, order in zip(per_round, interleaved_order(rounds), strict=True):
        paths: dict[str, RoundPath] = {}
        added: dict[str, float] = {}
        cpu_s = gen_pct = 0.0
        for name in order:
            cpu0 = _cpu_s(server)
            sample = gens.run(msgspec.structs.replace(blocks[name], requests=n))
            paths[name] = round_path(sample.latencies_ms, sample.wall_s)
            if name == "proxy":
                cpu_s = _cpu_s(server) - cpu0
                gen_pct = sample.cpu_s / sample.wall_s / used * 100.0
                extra = paired_added(sample.latencies_ms, sample.upstream_ms)
                added = {p: percentile(extra, q) for p, q in PERCENTILES.items()}
        measured.append(
            RoundMeasure(
                direct=paths["direct"],
                proxy=paths["proxy"],
                added=added,
                proxy_cpu_s=cpu_s,
                generator_cpu_pct=gen_pct,
            )
        )
    return summarise(concurrency, requests, measured)


@contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the bench runs, so its ``finally`` blocks stop the
    server, the engine and the generators it started instead of leaving them orphaned."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_bench(
    requests: int,
    concurrencies: list[int],
    rounds: int = DEFAULT_ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> list[BenchResult]:
    """Start a server, a FAKE engine and the generators, measure every level, stop them all.

    Args:
        requests: requests per path per level (split over ``rounds``).
        concurrencies: closed-loop client counts, measured in this order.
        rounds: interleaved direct/proxied rounds per level.
        progress: called with one line per finished level (e.g. to print on stderr).

    Raises:
        BenchStatsError: fewer than :data:`MIN_REQUESTS_PER_ROUND` requests per round.
        RuntimeError: a bench request failed or a child process did not start.
    """
    # The harness brings the server and HTTP stacks: imported only when a benchmark runs.
    from grid_server.harness import Testbed, start_fake_engine, start_server

    if rounds < 1 or requests // rounds < MIN_REQUESTS_PER_ROUND:
        msg = (
            f"--requests {requests} over --rounds {rounds} gives fewer than "
            f"{MIN_REQUESTS_PER_ROUND} requests per round; raise --requests or lower --rounds"
        )
        raise BenchStatsError(msg)
    with _terminate_as_exit(), tempfile.TemporaryDirectory(prefix="grid-bench-") as tmp:
        work = Path(tmp)
        engine, key = start_fake_engine(work, BENCH_MODEL)
        server = None
        stop = threading.Event()
        beat: threading.Thread | None = None
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
            results: list[BenchResult] = []
            with Generators(GENERATOR_PROCESSES) as gens:
                for c in concurrencies:
                    r = _measure(gens, engine.url, key, server.url, server.pid, requests, c, rounds)
                    results.append(r)
                    if progress is not None:
                        progress(
                            f"{c} clients: proxy {r.proxy_rps.median} rps, direct "
                            f"{r.direct_rps.median} rps, added p50 {r.added_p50_ms.median} ms "
                            f"(load {r.load_avg[0]})"
                        )
            stop.set()
            beat.join()
            gc.close()
            return results
        finally:
            stop.set()
            if server is not None:
                server.stop()
            engine.stop()


def _cell(s: Spread, difference: bool = False) -> str:
    if difference and s.within_noise:
        return f"noise ({s.low:g}..{s.high:g})"
    return f"{s.median:g} ({s.low:g}..{s.high:g})"


def render_results(results: list[BenchResult]) -> str:
    """The human report: one row per level, then what each column means."""
    table = render_table(
        [
            "clients",
            "proxy rps",
            "direct rps",
            "added p50 ms",
            "added p95 ms",
            "added p99 ms",
            "proxy-direct p50 ms",
            "proxy-direct p99 ms",
            "proxy cpu us/req",
            "gen cpu %",
            "load 1m",
        ],
        [
            [
                r.concurrency,
                _cell(r.proxy_rps),
                _cell(r.direct_rps),
                _cell(r.added_p50_ms),
                _cell(r.added_p95_ms),
                _cell(r.added_p99_ms),
                _cell(r.proxy_minus_direct_p50_ms, difference=True),
                _cell(r.proxy_minus_direct_p99_ms, difference=True),
                r.proxy_cpu_us_per_request,
                f"{r.generator_cpu_pct:g}" + (" BUSY" if r.generator_busy else ""),
                r.load_avg[0],
            ]
            for r in results
        ],
    )
    first = results[0] if results else None
    lines = [
        table,
        "",
        "each cell: median round (lowest..highest round); "
        f"{first.rounds if first else 0} interleaved rounds, "
        f"{first.requests if first else 0} requests per path per level",
        "added = per request, latency through Grid minus the engine time Grid reported in "
        "Server-Timing (Grid's work and queueing plus the hops to and from Grid; >= 0 by "
        "measurement; understates when Grid's event loop is the bottleneck)",
        "proxy-direct = proxied percentile minus direct percentile per round; 'noise' unless "
        "every round found it positive",
        f"machine: {os.cpu_count()} cores, load average at the end "
        + (" / ".join(f"{x:g}" for x in results[-1].load_avg) if results else "n/a")
        + " (a loaded machine measures its scheduler as much as the proxy)",
    ]
    if any(r.generator_busy for r in results):
        lines.append(
            f"BUSY: a generator process used more than {GENERATOR_BUSY_PCT:g}% of a core; "
            "that level's rates may be the generator's limit, not the proxy's"
        )
    return "\n".join(lines)


def bench_proxy(
    requests: int = typer.Option(
        2000, "--requests", min=100, help="Requests per path per concurrency level."
    ),
    concurrency: list[int] = typer.Option(  # noqa: B008
        [1, 8, 32, 64],
        "--concurrency",
        min=1,
        help="Concurrency levels (repeatable).",
    ),
    rounds: int = typer.Option(
        DEFAULT_ROUNDS,
        "--rounds",
        min=1,
        help="Interleaved direct/proxied rounds per level (figures are medians over them).",
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
    from grid_server.client import CliError

    if tls:
        _bench_tls(requests, concurrency, as_json)
        return
    try:
        results = run_bench(
            requests, concurrency, rounds, progress=lambda line: typer.echo(line, err=True)
        )
    except BenchStatsError as exc:
        raise CliError(str(exc), 2) from None
    except RuntimeError as exc:  # a bench request failed or a child did not start
        raise CliError(str(exc)) from None
    if as_json:
        doc = {
            "results": msgspec.to_builtins(results),
            "cores": os.cpu_count(),
            "load_avg": list(_load_avg()),
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(render_results(results))


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
