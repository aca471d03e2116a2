"""``grid bench proxy --json`` runs end to end and reports the documented shape.

Numbers are printed, never asserted (the machine is shared and noisy).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from grid_core.system import wait_until_sync

pytestmark = pytest.mark.benchmark

GRID_BIN = Path(sys.executable).parent / "grid"
SPREADS = {
    "proxy_rps",
    "direct_rps",
    "added_p50_ms",
    "added_p95_ms",
    "added_p99_ms",
    "proxy_minus_direct_p50_ms",
    "proxy_minus_direct_p99_ms",
}
KEYS = {"concurrency", "requests", "rounds", "generator_cpu_pct", "load_avg", *SPREADS}


def test_bench_proxy_json_shape() -> None:
    r = subprocess.run(
        [
            str(GRID_BIN),
            "bench",
            "proxy",
            "--requests",
            "300",
            "--rounds",
            "3",
            "--concurrency",
            "1",
            "--concurrency",
            "32",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    results = doc["results"]
    assert [x["concurrency"] for x in results] == [1, 32]
    assert doc["cores"] >= 1 and len(doc["load_avg"]) == 3
    for x in results:
        assert set(x) >= KEYS
        assert x["requests"] == 300 and x["rounds"] == 3
        assert x["direct_rps"]["median"] > 0 and x["proxy_rps"]["median"] > 0
        for name in SPREADS:
            assert x[name]["low"] <= x[name]["median"] <= x[name]["high"], name
        # Paired per request against Grid's own Server-Timing: never negative.
        for name in ("added_p50_ms", "added_p95_ms", "added_p99_ms"):
            assert x[name]["low"] >= 0.0, name
    print(json.dumps(doc, indent=2))


def test_bench_proxy_stopped_by_sigterm_leaves_no_process_behind(tmp_path: Path) -> None:
    """An operator's Ctrl-C or a CI timeout's SIGTERM stops the bench's server, fake engine
    and generator processes too (no orphan keeps loading the machine)."""
    with (tmp_path / "bench.err").open("w") as err:
        bench = subprocess.Popen(
            [str(GRID_BIN), "bench", "proxy", "--requests", "100000", "--concurrency", "8"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    parent = psutil.Process(bench.pid)
    try:
        # Server, engine and two generators: wait until all four are running.
        assert wait_until_sync(
            lambda: len(parent.children(recursive=True)) >= 4, timeout_s=120.0, interval_s=0.2
        ), (tmp_path / "bench.err").read_text()
        children = [(c.pid, c.create_time()) for c in parent.children(recursive=True)]
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=120.0)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode != 0  # stopped, not finished

    def gone() -> bool:
        for pid, created in children:
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                continue
        return True

    assert wait_until_sync(gone, timeout_s=60.0, interval_s=0.2), children


TLS_KEYS = {
    "concurrency",
    "requests",
    "p50_added_ms",
    "p99_added_ms",
    "loopback_p50_ms",
    "tls_p50_ms",
    "loopback_rps",
    "tls_rps",
}


def test_bench_proxy_tls_case_json_shape() -> None:
    """The TLS case: an engine behind a TLS front in a network namespace vs one on loopback."""
    from grid_core.system.netns import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces are unavailable here: {reason}")
    r = subprocess.run(
        [
            str(GRID_BIN),
            "bench",
            "proxy",
            "--tls",
            "--requests",
            "200",
            "--concurrency",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)["tls_results"]
    assert [x["concurrency"] for x in results] == [8]
    for x in results:
        assert set(x) >= TLS_KEYS
        assert x["requests"] == 200 and x["tls_rps"] > 0 and x["loopback_rps"] > 0
    print(json.dumps(results, indent=2))
