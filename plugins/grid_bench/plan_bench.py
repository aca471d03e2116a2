"""``grid bench plan``: time the planner on a neutral fleet file and print the numbers.

Timings are printed, never asserted. The overcommit figure comes from an independent check of
the assignments against the file's capacities (:func:`grid_bench.fleet.overcommitted_hosts`).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Annotated

import typer

from grid_bench.fleet import fleet_inputs, load_fleet, overcommitted_hosts
from grid_core.planner import plan
from grid_core.table import render_table

JSON_KEYS = (
    "p50_ms",
    "p90_ms",
    "desired",
    "placed",
    "unsatisfied",
    "overcommitted_hosts",
    "assignments",
)
"""Exactly the keys ``--json`` prints (a checker can rely on them and nothing else)."""
DEFAULT_RUNS = 15
"""Timed plans per fleet: enough for a stable p50/p90 on a noisy 2-core machine."""
WARMUP_RUNS = 1
"""Untimed first plan (imports, plugin term collection)."""


def run_plan_bench(path: Path, runs: int = DEFAULT_RUNS) -> dict:
    """Plan ``path`` ``runs`` times (no reuse) and summarise.

    Returns:
        ``{p50_ms, p90_ms, desired, placed, unsatisfied, overcommitted_hosts, assignments}``
        (desired/placed/unsatisfied are replica counts; overcommitted_hosts is a host count)
        plus ``evictions``, ``cpu_p50_ms`` (process CPU time: the wall-clock figures include
        whatever else the machine is doing) and an ``unmet`` breakdown for the table.
    """
    from grid_core.plugins import get_plugins

    data = load_fleet(path)
    inputs = fleet_inputs(data)
    plugins = get_plugins()
    result = None
    for _ in range(WARMUP_RUNS):
        result = plan(inputs, plugins, reuse=False)
    times = []
    cpu = []
    for _ in range(max(1, runs)):
        t0, c0 = time.perf_counter(), time.process_time()
        result = plan(inputs, plugins, reuse=False)
        times.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    assert result is not None
    times.sort()
    assignments = [{"model_id": a.model_id, "host_id": a.host_id} for a in result.assignments]
    desired = sum(result.desired.values())
    codes: dict[str, int] = {}
    for u in result.unmet:
        codes[u.code] = codes.get(u.code, 0) + max(1, u.missing)
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p90_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))], 3),
        "desired": desired,
        "placed": len(result.assignments),
        "unsatisfied": desired - len(result.assignments),
        "overcommitted_hosts": len(overcommitted_hosts(data, assignments)),
        "assignments": assignments,
        "evictions": len(result.evictions),
        "cpu_p50_ms": round(statistics.median(cpu), 3),
        "unmet": codes,
    }


def bench_plan(
    fleet: Annotated[Path, typer.Option("--fleet", help="grid-bench-fleet/1 JSON file.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Timed plans.")] = DEFAULT_RUNS,
) -> None:
    """Time the placement planner on a fleet file (p50/p90 ms) and check the placement."""
    out = run_plan_bench(fleet, runs)
    if as_json:
        typer.echo(json.dumps({k: out[k] for k in JSON_KEYS}))
        return
    rows = [
        [k, out[k]]
        for k in (
            "p50_ms",
            "p90_ms",
            "cpu_p50_ms",
            "desired",
            "placed",
            "unsatisfied",
            "overcommitted_hosts",
            "evictions",
        )
    ]
    rows += [[f"unmet:{k}", v] for k, v in sorted(out["unmet"].items())]
    typer.echo(render_table(["metric", "value"], rows))
