"""``grid bench proxy --json`` runs end to end and reports the documented shape.

Numbers are printed, never asserted (the machine is shared and noisy).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark

GRID_BIN = Path(sys.executable).parent / "grid"
KEYS = {
    "concurrency",
    "requests",
    "p50_added_ms",
    "p99_added_ms",
    "direct_rps",
    "proxy_rps",
    "generator_cpu_pct",
}


def test_bench_proxy_json_shape() -> None:
    r = subprocess.run(
        [
            str(GRID_BIN),
            "bench",
            "proxy",
            "--requests",
            "200",
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
    results = json.loads(r.stdout)["results"]
    assert [x["concurrency"] for x in results] == [1, 32]
    for x in results:
        assert set(x) >= KEYS
        assert x["requests"] == 200
        assert x["direct_rps"] > 0 and x["proxy_rps"] > 0
    print(json.dumps(results, indent=2))


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
