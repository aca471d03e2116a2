"""``grid bench tick``: time a full controller tick on a neutral fleet file.

A tick here is everything the server's periodic pass runs: demand forecast, plan,
reconciliation, the mutation governor, action issue and the atomic state write (to a real
file in a temporary directory). The controller runs in automatic mode against the fleet's
hosts; time advances five seconds per tick and the heartbeat ages stay as the file gives
them, so each tick plans fresh inputs. The fleet's observed demand replaces the (empty)
request history so the planner sees the same pressure as ``grid bench plan``.

Timings are printed, never asserted.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated

import msgspec
import typer

from grid_bench.fleet import fleet_inputs, load_fleet
from grid_core.api import Plan, PlanInputs, PlannerHooks, render_table

DEFAULT_RUNS = 20
"""Timed ticks per fleet: enough for a stable p50/p90 on a noisy 2-core machine."""
WARMUP_RUNS = 2
"""Untimed first ticks (imports, plugin collection, the first plan's cold caches)."""
TICK_STEP_S = 5.0
"""Simulated seconds between ticks: the server's default periodic pass."""


def run_tick_bench(path: Path, runs: int = DEFAULT_RUNS) -> dict[str, object]:
    """Run ``runs`` timed controller ticks on the fleet at ``path`` and summarise.

    Returns:
        ``{p50_ms, p90_ms, runs, hosts, models, assignments, proposals, issued, deferred,
        pending, state_bytes}``.

    Raises:
        NotFoundError / ValidationError: the fleet file is missing or malformed.
    """
    from grid_core.api import Controller, FileStateStore, get_plugins, plan

    data = load_fleet(path)
    inputs = fleet_inputs(data)
    plugins = get_plugins()

    def plan_with_fleet_demand(pi: PlanInputs, hooks: PlannerHooks) -> Plan:
        return plan(msgspec.structs.replace(pi, demand=inputs.demand), hooks)

    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="grid-bench-tick-") as tmp:
        store = FileStateStore(Path(tmp) / "controller.json")
        ctl = Controller(plugins=plugins, store=store, plan_fn=plan_with_fleet_demand).restore()
        now = inputs.now
        for p in inputs.profiles:
            ctl.put_profile(p, now)
        ctl.set_mode("automatic", now)
        result = None
        for i in range(WARMUP_RUNS + max(1, runs)):
            now += TICK_STEP_S
            t0 = time.perf_counter()
            result = ctl.tick(now, inputs.hosts)
            elapsed = (time.perf_counter() - t0) * 1000.0
            if i >= WARMUP_RUNS:
                times.append(elapsed)
        state_bytes = store.path.stat().st_size
    assert result is not None
    times.sort()
    rep = result.reconciliation
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p90_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))], 3),
        "runs": len(times),
        "hosts": len(inputs.hosts),
        "models": len(inputs.profiles),
        "assignments": len(result.plan.assignments),
        "proposals": len(rep.proposals),
        "issued_last_tick": len(rep.issued),
        "deferred": len(rep.deferred),
        "pending": len(ctl.book.active()),
        "state_bytes": state_bytes,
    }


def bench_tick(
    fleet: Annotated[Path, typer.Option("--fleet", help="grid-bench-fleet/1 JSON file.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Timed ticks.")] = DEFAULT_RUNS,
) -> None:
    """Time a full controller tick (forecast, plan, reconcile, persist) on a fleet file."""
    out = run_tick_bench(fleet, runs)
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(render_table(["metric", "value"], [[k, v] for k, v in out.items()]))
