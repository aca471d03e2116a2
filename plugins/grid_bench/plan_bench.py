"""``grid bench plan``: time the planner on a neutral fleet file and print the numbers.

Timings are printed, never asserted. Violations come from an independent check of the
assignments against the file alone (:func:`grid_bench.fleet.violations`). ``--exact`` also
solves the same input as a mixed-integer program (:mod:`grid_core.planner.exact`, needs the
optional ``highspy``) and prints the optimum, Grid's coverage and the gap.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Annotated

import typer

from grid_bench.fleet import fleet_inputs, load_fleet, violations
from grid_core.api import DEFAULT_TIME_LIMIT_S, PLANNER_BUILD, plan, render_table

JSON_KEYS = (
    "p50_ms",
    "p90_ms",
    "cpu_p50_ms",
    "desired",
    "placed",
    "unsatisfied",
    "coverage",
    "overcommitted_hosts",
    "violations",
    "evictions",
    "unmet",
    "assignments",
    "planner_build",
    "planner_build_reason",
)
"""The keys ``--json`` always prints (``exact`` is added with ``--exact``)."""
DEFAULT_RUNS = 15
"""Timed plans per fleet: enough for a stable p50/p90 on a noisy 2-core machine."""
WARMUP_RUNS = 1
"""Untimed first plan (imports, plugin term collection)."""


def run_plan_bench(path: Path, runs: int = DEFAULT_RUNS) -> dict:
    """Plan ``path`` ``runs`` times (no reuse) and summarise.

    Returns:
        ``{p50_ms, p90_ms, desired, placed, unsatisfied, coverage, overcommitted_hosts,
        violations, unmet, assignments}``: desired/placed/unsatisfied are replica counts,
        coverage is placed/desired, overcommitted_hosts a host count, violations the total
        of :func:`grid_bench.fleet.violations` (``violation_kinds`` has the breakdown), unmet
        one row per shortfall (model, code, binding resource, missing); plus ``evictions``,
        ``cpu_p50_ms`` (process CPU time: the wall-clock figures include whatever else the
        machine is doing), ``unmet_codes``, the plan ``inputs`` (for ``--exact``),
        ``planner_build`` (``native`` or ``interpreted``: which build of the planner was
        timed, see :mod:`grid_core.native`) and ``planner_build_reason``.
    """
    from grid_core.api import get_plugins

    data = load_fleet(path)
    inputs = fleet_inputs(data)
    hooks = get_plugins().planner_hooks()
    result = None
    for _ in range(WARMUP_RUNS):
        result = plan(inputs, hooks, reuse=False)
    times = []
    cpu = []
    for _ in range(max(1, runs)):
        t0, c0 = time.perf_counter(), time.process_time()
        result = plan(inputs, hooks, reuse=False)
        times.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    assert result is not None
    times.sort()
    assignments = [{"model_id": a.model_id, "host_id": a.host_id} for a in result.assignments]
    desired = sum(result.desired.values())
    codes: dict[str, int] = {}
    for u in result.unmet:
        codes[u.code] = codes.get(u.code, 0) + max(1, u.missing)
    kinds = violations(data, assignments)
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p90_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))], 3),
        "desired": desired,
        "placed": len(result.assignments),
        "unsatisfied": desired - len(result.assignments),
        "coverage": round(len(result.assignments) / desired, 4) if desired else 1.0,
        "overcommitted_hosts": len(kinds["memory"]),
        "violations": sum(len(v) for v in kinds.values()),
        "violation_kinds": {k: len(v) for k, v in kinds.items()},
        "unmet": [
            {
                "model_id": u.model_id,
                "code": u.code,
                "resource": u.resource,
                "missing": u.missing,
                **({"host_id": u.host_id} if u.host_id else {}),
            }
            for u in result.unmet
        ],
        "assignments": assignments,
        "evictions": len(result.evictions),
        "cpu_p50_ms": round(statistics.median(cpu), 3),
        "unmet_codes": codes,
        "inputs": inputs,
        "planner_build": "native" if PLANNER_BUILD.active else "interpreted",
        "planner_build_reason": PLANNER_BUILD.reason,
    }


def exact_summary(out: dict, time_limit_s: float) -> dict:
    """Solve the bench input exactly and compare (see :mod:`grid_core.planner.exact`).

    Returns:
        ``{optimum, coverage, grid_coverage, gap, unordered, unordered_coverage, bound,
        bound_coverage, optimal, status, solve_s, variables, constraints, short_models,
        loss_by_class}``;
        ``gap`` is the optimum's coverage minus Grid's (0 when Grid is optimal); ``bound``
        is HiGHS's proven ceiling on any plan's replicas (when ``optimal`` is false the
        optimum is only the best plan found, and the true gap is at most
        ``bound_coverage - grid_coverage``); ``short_models`` lists
        models Grid places fewer replicas of than the optimum, ``loss_by_class`` maps each
        priority (as a string) to the replicas its host choices cost
        (:func:`grid_core.planner.exact.loss_by_class`; empty when Grid places as many as
        the unordered optimum). ``solve_s`` covers the optimum only.

    Raises:
        ValidationError: ``highspy`` is missing (the message names the extra).
    """
    from grid_core.api import exact_loss_by_class, exact_optimum, prime_quietly

    prime_quietly()
    pairs = [(a["model_id"], a["host_id"]) for a in out["assignments"]]
    started = time.perf_counter()
    # Grid's plan is the solver's first incumbent: an unproven optimum is never a worse plan
    res = exact_optimum(out["inputs"], time_limit_s, start=pairs)
    solve_s = time.perf_counter() - started
    loss: dict[int, int] = {}
    if res.unordered > out["placed"]:  # nothing to attribute when Grid places the most
        loss = exact_loss_by_class(out["inputs"], pairs, time_limit_s)
    desired = out["desired"]
    grid_cov = out["placed"] / desired if desired else 1.0
    per_model: dict[str, int] = {}
    for a in out["assignments"]:
        per_model[a["model_id"]] = per_model.get(a["model_id"], 0) + 1
    short = {
        m: {"grid": per_model.get(m, 0), "exact": n}
        for m, n in res.per_model.items()
        if per_model.get(m, 0) < n
    }
    return {
        "optimum": res.optimum,
        "coverage": round(res.coverage, 4),
        "grid_coverage": round(grid_cov, 4),
        "gap": round(res.coverage - grid_cov, 4),
        "unordered": res.unordered,
        "unordered_coverage": round(res.unordered / desired, 4) if desired else 1.0,
        "bound": res.bound,
        "bound_coverage": round(res.bound / desired, 4) if desired else 1.0,
        "optimal": res.optimal,
        "status": res.status,
        "solve_s": round(solve_s, 3),
        "variables": res.variables,
        "constraints": res.constraints,
        "short_models": short,
        "loss_by_class": {str(prio): n for prio, n in loss.items()},
    }


def exact_short_text(ex: dict) -> str:
    """The models Grid places fewer replicas of than the optimum, one row each (text form).

    Args:
        ex: an :func:`exact_summary` result.

    Returns:
        A table ``model | grid | optimum | short`` (replica counts), or one line saying that
        Grid matches the optimum for every model; before it, a line when the optimum is not
        proven (HiGHS's status and the bound; the advice to raise the time limit only when
        the time limit stopped it), or when only the unordered maximum is not (``unordered``
        below ``bound``: ``loss_by_class`` starts from such a solve).
    """
    short = ex["short_models"]
    lines = []
    if not ex["optimal"]:
        timed_out = ex["status"].startswith("Time limit")
        lines.append(
            (
                f"exact: not proven optimal within --exact-time-limit (HiGHS: {ex['status']}); "
                if timed_out
                else f"exact: not proven optimal: HiGHS ended a solve with status "
                f"{ex['status']!r} (a solve error is retried once without presolve); "
            )
            + f"the optimum above is the best plan found. No plan places more than "
            f"{ex['bound']} replicas, so Grid is at most "
            f"{max(0.0, ex['bound_coverage'] - ex['grid_coverage']):.4f} below any plan."
            + (" Raise --exact-time-limit for a proof." if timed_out else "")
        )
    elif ex.get("unordered", ex["bound"]) < ex["bound"]:
        # the ladder proved the optimum, but the first (unordered) solve stopped at the limit
        lines.append(
            f"exact: the optimum is proven; the most replicas ignoring priority is not "
            f"(HiGHS stopped at --exact-time-limit): the best plan found places "
            f"{ex['unordered']}, no plan more than {ex['bound']}, and loss_by_class rests on "
            "such solves too. Raise --exact-time-limit for a proof."
        )
    if not short:
        lines.append("exact: Grid places as many replicas as the optimum for every model")
    else:
        rows = [
            [m, c["grid"], c["exact"], c["exact"] - c["grid"]] for m, c in sorted(short.items())
        ]
        lines.append(render_table(["model", "grid", "optimum", "short"], rows))
    return "\n".join(lines)


def _missing_cell(unmet: dict) -> object:
    """The ``missing`` cell of a shortfall row: a pin (unusable, or waiting for a staged
    change) whose replica went to another host misses nothing, and says so."""
    if unmet.get("host_id") and not unmet["missing"]:
        return "0 (placed on another host)"
    return unmet["missing"]


def bench_plan(
    fleet: Annotated[Path, typer.Option("--fleet", help="grid-bench-fleet/1 JSON file.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    runs: Annotated[int, typer.Option("--runs", min=1, help="Timed plans.")] = DEFAULT_RUNS,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Also solve the fleet as a MILP (HiGHS; pip install 'grid\\[exact]') and "
            "print the optimum, Grid's coverage, the gap and the models Grid places fewer "
            "replicas of than the optimum.",
        ),
    ] = False,
    time_limit: Annotated[
        float,
        typer.Option(
            "--exact-time-limit",
            min=0.1,
            help="Solver budget per solve, seconds. A fleet that cannot be placed in full "
            "takes several solves (about one per priority class for the ordered optimum, as "
            "many again for the loss per class), so a run can take several times this. "
            "HiGHS checks it between the phases of a solve, so a large fleet's solves can "
            "each run past it.",
        ),
    ] = DEFAULT_TIME_LIMIT_S,
) -> None:
    """Time the placement planner on a fleet file (p50/p90 ms) and check the placement."""
    out = run_plan_bench(fleet, runs)
    ex = None
    if exact:
        if not as_json:
            typer.echo("grid: solving the exact optimum (HiGHS)...", err=True)
        ex = exact_summary(out, time_limit)
    if as_json:
        doc = {k: out[k] for k in JSON_KEYS}
        if ex is not None:
            doc["exact"] = ex
        typer.echo(json.dumps(doc))
        return
    keys = ("p50_ms", "p90_ms", "cpu_p50_ms", "desired", "placed", "unsatisfied", "coverage")
    rows = [[k, out[k]] for k in keys]
    rows += [
        ["overcommitted_hosts", out["overcommitted_hosts"]],
        ["violations", out["violations"]],
        ["evictions", out["evictions"]],
    ]
    rows += [["planner_build", out["planner_build_reason"]]]
    rows += [[f"violations:{k}", v] for k, v in out["violation_kinds"].items() if v]
    rows += [[f"unmet:{k}", v] for k, v in sorted(out["unmet_codes"].items())]
    if ex is not None:
        rows += [
            ["exact:optimum", ex["optimum"]],
            ["exact:coverage", ex["coverage"]],
            ["exact:gap", ex["gap"]],
            ["exact:unordered_coverage", ex["unordered_coverage"]],
            ["exact:bound", ex["bound"]],
            ["exact:status", ex["status"]],
            ["exact:solve_s", ex["solve_s"]],
        ]
        rows += [[f"exact:loss_by_class:{p}", n] for p, n in ex["loss_by_class"].items()]
    typer.echo(render_table(["metric", "value"], rows))
    if ex is not None:
        typer.echo("")
        typer.echo(exact_short_text(ex))
    short = [u for u in out["unmet"] if u["code"] != "failure_domain_shortfall"]
    if short:
        typer.echo("")
        typer.echo(
            render_table(
                ["model", "code", "binding", "host", "missing"],
                [
                    [u["model_id"], u["code"], u["resource"] or "-", u.get("host_id", "-"), n]
                    for u in short
                    for n in [_missing_cell(u)]
                ],
            )
        )
