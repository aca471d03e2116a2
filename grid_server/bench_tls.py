"""``grid bench proxy --tls``: what an engine on another host, behind TLS, adds to a request.

Two FAKE engines serve two model names through the same server: one on the server's loopback
(the loopback path) and one in a private network namespace (``grid_core.system.netns``)
behind a node's TLS engine front (``python -m grid_node.engine_tls``), reached over the lab's
veth link and verified against a private CA with hostname checking (the TLS path). Load
generators send proxied requests to both in alternating blocks, so machine noise hits both
alike; the added latency is the TLS path's percentile minus the loopback path's (ms). It
measures the link, the TLS hop and the front's relay together: what a remote engine costs.

Root only (it creates a namespace); refused with the reason elsewhere.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
from pathlib import Path

import msgspec

from grid_core.errors import UnavailableError
from grid_core.system.netns import NetLab, unavailable_reason
from grid_core.tls import issue_cert, make_ca
from grid_server.bench_stats import percentile
from grid_server.harness import Testbed, start_engine_front, start_fake_engine, start_server
from grid_server.loadgen import Block, Generators

LOOPBACK_MODEL = "bench-loopback"
TLS_MODEL = "bench-tls"
LOOPBACK_HOST = "bench-host"
"""The node whose engine is on the server's loopback."""
REMOTE_HOST = "bench-remote"
"""The node in the namespace: it advertises the namespace address its TLS front is on."""
BLOCK = 500
"""Requests per alternating block (as in the direct-vs-proxy case)."""
WARMUP = 200
"""Requests per path before measuring (TLS sessions, pooled connections)."""
GENERATOR_PROCESSES = 2
"""Load generator processes: one per core of a small machine."""
HEARTBEAT_EVERY_S = 15.0
"""Keeps the bench host's 60 s leases alive during a long run."""


class TlsBenchResult(msgspec.Struct):
    """One concurrency level (latencies in ms, rates in requests/s)."""

    concurrency: int
    requests: int
    p50_added_ms: float
    """TLS path p50 minus loopback path p50: what a remote TLS engine adds."""
    p99_added_ms: float
    loopback_p50_ms: float
    tls_p50_ms: float
    loopback_p99_ms: float
    tls_p99_ms: float
    loopback_rps: float
    tls_rps: float
    load_avg_1m: float
    """The machine's one-minute load average when this level finished (noise indicator)."""


def _body(model: str) -> bytes:
    return msgspec.json.encode(
        {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "ping"}]}
    )


def _measure(gens: Generators, grid_url: str, requests: int, concurrency: int) -> TlsBenchResult:
    ctype = {"content-type": "application/json"}
    url = grid_url + "/v1/chat/completions"
    loop_block = Block(
        url=url, headers=ctype, body=_body(LOOPBACK_MODEL), requests=0, concurrency=concurrency
    )
    tls_block = msgspec.structs.replace(loop_block, body=_body(TLS_MODEL))
    warm = max(WARMUP, concurrency * 4)
    gens.run(msgspec.structs.replace(loop_block, requests=warm))
    gens.run(msgspec.structs.replace(tls_block, requests=warm))
    loop_lat: list[float] = []
    tls_lat: list[float] = []
    loop_s = tls_s = 0.0
    done = 0
    while done < requests:
        n = min(BLOCK, requests - done)
        sample = gens.run(msgspec.structs.replace(loop_block, requests=n))
        loop_lat += sample.latencies_ms
        loop_s += sample.wall_s
        sample = gens.run(msgspec.structs.replace(tls_block, requests=n))
        tls_lat += sample.latencies_ms
        tls_s += sample.wall_s
        done += n
    return TlsBenchResult(
        concurrency=concurrency,
        requests=requests,
        p50_added_ms=round(statistics.median(tls_lat) - statistics.median(loop_lat), 3),
        p99_added_ms=round(percentile(tls_lat, 0.99) - percentile(loop_lat, 0.99), 3),
        loopback_p50_ms=round(statistics.median(loop_lat), 3),
        tls_p50_ms=round(statistics.median(tls_lat), 3),
        loopback_p99_ms=round(percentile(loop_lat, 0.99), 3),
        tls_p99_ms=round(percentile(tls_lat, 0.99), 3),
        loopback_rps=round(requests / loop_s, 1),
        tls_rps=round(requests / tls_s, 1),
        load_avg_1m=round(os.getloadavg()[0], 2),
    )


def run_tls_bench(requests: int, concurrencies: list[int]) -> list[TlsBenchResult]:
    """Build the lab, start everything, measure every concurrency, tear everything down.

    Raises:
        UnavailableError: network namespaces cannot be made here (the reason is named).
    """
    reason = unavailable_reason()
    if reason is not None:
        msg = f"grid bench proxy --tls needs a network namespace: {reason}"
        raise UnavailableError(msg)
    with tempfile.TemporaryDirectory(prefix="grid-bench-tls-") as tmp, NetLab(("engine",)) as lab:
        work = Path(tmp)
        host = lab.host("engine")
        in_ns = host.argv([])
        ca_cert, ca_key = make_ca(work / "ca", "grid bench CA")
        cert, key = work / "engine.pem", work / "engine-key.pem"
        issue_cert(ca_cert, ca_key, [host.address], cert, key)
        local = remote = front = server = None
        stop = threading.Event()
        try:
            # Everything started is inside this try: a failed start stops what came before.
            local, local_key = start_fake_engine(work, LOOPBACK_MODEL)
            remote, remote_key = start_fake_engine(work, TLS_MODEL, prefix=in_ns)
            front = start_engine_front(
                work,
                remote.url,
                remote_key,
                advertise_host=host.address,
                cert=cert,
                key=key,
                ca=ca_cert,
                prefix=in_ns,
            )
            front_url = front.url
            server = start_server(work / "home")
            bed = Testbed(server.url, work / "home")
            # Two hosts, as in a real fleet: an engine route must be on its own node's
            # advertised address, so the namespace engine belongs to a node advertising it.
            token = bed.node_token(LOOPBACK_HOST)
            remote_token = bed.node_token(REMOTE_HOST)
            ca_pem = ca_cert.read_text()

            def keep_alive() -> None:
                while not stop.is_set():
                    bed.register_host(token, LOOPBACK_HOST)
                    bed.register_engine(token, LOOPBACK_HOST, LOOPBACK_MODEL, local.url, local_key)
                    bed.register_host(remote_token, REMOTE_HOST, advertise_host=host.address)
                    bed.register_engine(
                        remote_token, REMOTE_HOST, TLS_MODEL, front_url, remote_key, ca_pem=ca_pem
                    )
                    stop.wait(HEARTBEAT_EVERY_S)

            beat = threading.Thread(target=keep_alive, daemon=True)
            beat.start()
            bed.wait_ready(LOOPBACK_MODEL)
            bed.wait_ready(TLS_MODEL)
            gens = Generators(GENERATOR_PROCESSES)
            try:
                results = [_measure(gens, server.url, requests, c) for c in concurrencies]
            finally:
                gens.close()
            stop.set()
            beat.join()
            bed.close()
            return results
        finally:
            stop.set()
            if server is not None:
                server.stop()
            for child in (front, remote, local):
                if child is not None:
                    child.stop()
