"""``grid test scenario`` and ``grid test graduate``: the scenario lab's command line."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from grid_core.api import (
    MAX_TRACE_BYTES,
    WORKLOADS,
    ScenarioConfig,
    ValidationError,
    check_seed,
    parse_duration,
    parse_strategy,
    parse_trace,
    render_table,
)

MEASURED_TEXT_CHARS = 160
"""Longest nested gate evidence (JSON characters) the text gate table prints in full; the
predictive-savings scorecard (one entry per cell, about 250 characters each) is left to
``--json``."""
TRACE_ATTRIBUTION = (
    "Trace data: if a --workload-trace comes from the Azure LLM inference trace 2023 "
    '(CC-BY 4.0), credit Patel et al., "Splitwise", ISCA 2024.'
)


TRACE_OPTION = typer.Option(
    None, "--workload-trace", help="WORKLOAD=CSV (headerless 'seconds,rate'); repeatable."
)
"""A list-valued option is built once at module level (mutable defaults are shared)."""


def _traces(specs: list[str]) -> dict[str, tuple[tuple[float, float], ...]]:
    out: dict[str, tuple[tuple[float, float], ...]] = {}
    for spec in specs:
        workload, sep, path = spec.partition("=")
        if not sep or not workload or not path:
            msg = f"--workload-trace: {spec!r} is not WORKLOAD=CSV; e.g. coding=./trace.csv"
            raise ValidationError(msg)
        if workload not in WORKLOADS:
            msg = (
                f"--workload-trace: workload {workload!r} is unknown; use one of "
                f"{', '.join(WORKLOADS)}"
            )
            raise ValidationError(msg)
        if workload in out:
            msg = f"--workload-trace: {workload} is given twice; give one trace per workload"
            raise ValidationError(msg)
        p = Path(path)
        try:
            with p.open("rb") as fh:
                data = fh.read(MAX_TRACE_BYTES + 1)  # never read more than the bound
        except OSError as exc:
            msg = f"--workload-trace {workload}: cannot read {path}: {exc.strerror}"
            raise ValidationError(msg) from None
        out[workload] = parse_trace(workload, data)
    return out


def _config(
    machines: int,
    models: int,
    users: int,
    duration: str,
    seed: int,
    strategy: str,
    traces: list[str],
    oracle: bool,
    include_comfyui: bool = False,
) -> ScenarioConfig:
    cfg = ScenarioConfig(
        machines=machines,
        models=models,
        users=users,
        duration_s=parse_duration(duration),
        seed=seed,
        strategy=parse_strategy(strategy),
        traces={},
        oracle=oracle,
        include_comfyui=include_comfyui,
    )
    cfg.validate()  # bounds first: a bad flag fails before any file is read
    return ScenarioConfig(**{**cfg.__dict__, "traces": _traces(traces)}).validate()


def scenario(
    machines: int = typer.Option(8, "--machines", help="Logical machines (1-64)."),
    models: int = typer.Option(8, "--models", help="Catalog models (1-32)."),
    users: int = typer.Option(50, "--users", help="Simulated users (1-10000)."),
    duration: str = typer.Option("30m", "--duration", help="6m to 24h, e.g. 30m or 2h."),
    seed: int = typer.Option(42, "--seed", help="Root of every random stream."),
    strategy: str = typer.Option("smart", "--strategy", help="smart, reactive, greedy or static."),
    workload_trace: list[str] | None = TRACE_OPTION,
    oracle: bool = typer.Option(
        False, "--oracle", help="Add the hindsight oracle (<=4 machines, 9 models, 240m)."
    ),
    as_json: bool = typer.Option(False, "--json", help="The complete report as JSON."),
    timeline: bool = typer.Option(False, "--timeline", help="Print every changing tick."),
    include_comfyui: bool = typer.Option(
        False,
        "--include-comfyui",
        help="Make the last machine a ComfyUI media machine (the logical fleet's twin).",
    ),
) -> None:
    """Simulate a heterogeneous fleet driven by the production controller and planner."""
    from grid_core.api import run_scenario
    from grid_lab.env import lab_env

    cfg = _config(
        machines,
        models,
        users,
        duration,
        seed,
        strategy,
        workload_trace or [],
        oracle,
        include_comfyui,
    )
    started = time.perf_counter()
    with lab_env() as env:
        report = run_scenario(cfg, env)
    elapsed = time.perf_counter() - started
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True, indent=2))
    else:
        typer.echo(render_summary(report, timeline))
    if cfg.traces:
        typer.echo(TRACE_ATTRIBUTION, err=True)
    typer.echo(f"grid: scenario finished in {elapsed:.1f} s", err=True)


def render_summary(report: dict, with_timeline: bool) -> str:
    """Human summary of a scenario report (the JSON holds everything)."""
    s, d = report["scenario"], report["demand"]
    lines = [
        f"scenario: {s['machines']} machines, {s['models']} models, {s['users']} users, "
        f"{s['duration_s'] / 60:g} min, seed {s['seed']}, strategy {s['strategy']}",
        f"arrivals: {report['arrivals']['count']} requests, digest "
        f"{report['arrivals']['digest'][:16]}",
        f"served: {d['served']}/{d['requests']} ({d['served_fraction']:.1%}); unavailable "
        f"{d['unavailable']}, overload failures {d['rejected']}",
        f"SLO attainment: {report['slo']['attainment']:.1%} (allocatable workloads "
        f"{report['slo']['attainment_allocatable']:.1%}); suitability {report['suitability']:.3f}",
    ]
    lc = report["lifecycle"]
    lines.append(
        f"lifecycle: {lc['cold_starts']} cold starts, {lc['unloads']} unloads, "
        f"{lc['deferred_unloads']} deferred by min residency, cache locality "
        f"{lc['cache_locality']:.0%}, downloaded {lc['downloaded_mb']} MB"
    )
    sf = report["safety"]
    lines.append(f"safety: {sf['total']} violations {sf['violations']}")
    if d["least_served_user"]:
        u = d["least_served_user"]
        lines.append(
            f"least-served user: #{u['user']} ({u['persona']}) "
            f"{u['served_fraction']:.1%} of {u['requests']}"
        )
    if d["least_served_workload"]:
        w = d["least_served_workload"]
        lines.append(f"least-served workload: {w['workload']} {w['served_fraction']:.1%}")
    lines += ["", _workload_table(report), ""]
    for rec in report["capacity_recommendations"]:
        lines.append(f"recommendation: {rec}")
    sc = report["score"]
    lines.append(
        f"score: {sc['overall']:.4f} "
        + " ".join(f"{k}={v:.3f}" for k, v in sc["components"].items())
    )
    if "oracle" in report:
        o = report["oracle"]
        lines.append(
            f"oracle: ceiling {o['ceiling_served']} served vs {o['strategy_served']} "
            f"(gap {o['gap']}, {o['gap_fraction']:.1%}); {o['states_evaluated']} "
            f"placements scored, {o['mutations']} mutations; {o['gap_meaning']}"
        )
    if with_timeline:
        lines += ["", *_timeline_lines(report)]
    return "\n".join(lines)


def _workload_table(report: dict) -> str:
    """The per-workload table of a scenario report: requests, served, SLO attainment,
    whether the fleet can allocate it, admission minutes and what it waited behind most."""
    d = report["demand"]
    rows = [
        [
            w,
            x["requests"],
            x["served"],
            f"{x['served_fraction']:.1%}",
            f"{x['slo_attainment']:.1%}",
            "yes" if x["allocatable"] else "no",
            ", ".join(f"{k}={v}" for k, v in report["admission_minutes"].get(w, {}).items()),
            _top_blocker(report["admission_blocker_minutes"].get(w, {})),
        ]
        for w, x in d["by_workload"].items()
    ]
    header = [
        "workload",
        "requests",
        "served",
        "served%",
        "SLO%",
        "allocatable",
        "admission minutes",
        "waited behind",
    ]
    return render_table(header, rows)


def _timeline_lines(report: dict) -> list[str]:
    """One line per simulated minute: nodes, residencies, unmet and overloaded models."""
    out = []
    for t in report["timeline"]:
        parts = (
            t["nodes"]
            + t["residency"]
            + [f"unmet {u}" for u in t["unmet"]]
            + [f"overloaded {m}" for m in t["overloaded"]]
        )
        out.append(f"t+{t['tick']:>4} min  " + "; ".join(parts))
    return out


def _top_blocker(row: dict[str, int]) -> str:
    if not row:
        return "-"
    model, minutes = max(sorted(row.items()), key=lambda kv: kv[1])
    return f"{model} ({minutes} min)"


def graduate_cmd(
    machines: str = typer.Option("2,4,8", "--machines", help="Comma-separated fleet sizes."),
    seeds: str = typer.Option("42,144", "--seeds", help="Comma-separated seeds."),
    duration: str = typer.Option("2h", "--duration", help="6m to 24h."),
    models: int = typer.Option(9, "--models", help="Catalog models (1-32)."),
    users: int = typer.Option(100, "--users", help="Simulated users (1-10000)."),
    as_json: bool = typer.Option(False, "--json", help="Runs and gates as JSON."),
) -> None:
    """Run every strategy per fleet size and seed and print each graduation gate."""
    from grid_core.api import graduate
    from grid_lab.env import lab_env

    sizes = _ints("--machines", machines)
    seed_list = _seeds(seeds)
    base = ScenarioConfig(models=models, users=users, duration_s=parse_duration(duration))
    for size in sizes:
        ScenarioConfig(**{**base.__dict__, "machines": size}).validate()
    started = time.perf_counter()
    with lab_env() as env:
        result = graduate(
            tuple(sizes),
            tuple(seed_list),
            base,
            env,
            progress=lambda line: typer.echo(line, err=True),
        )
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True, indent=2))
    else:
        _print_graduation(result)
    typer.echo(f"grid: graduate finished in {time.perf_counter() - started:.1f} s", err=True)
    if not result["passed"]:
        sys.exit(1)


def _print_graduation(result: Mapping[str, Any]) -> None:
    """``grid test graduate``'s text output: one row per run, the oracle's table, then one
    row per gate (PASS or FAIL, its evidence and what fails it)."""
    rows = [
        [
            r["machines"],
            r["seed"],
            r["strategy"],
            r["score"],
            r["served"],
            r["violations"],
            r["mutations"],
            f"{r['least_workload']}={r['least_served']}",
            r["wait_minutes"],
            r["digest"][:12],
        ]
        for r in result["runs"]
    ]
    typer.echo(
        render_table(
            [
                "machines",
                "seed",
                "strategy",
                "score",
                "served",
                "violations",
                "mutations",
                "least workload",
                "wait min",
                "digest",
            ],
            rows,
        )
    )
    typer.echo("")
    typer.echo(render_oracle(result["oracle"]))
    typer.echo("")
    typer.echo(
        render_table(
            ["gate", "result", "measured", "failing"],
            [
                [
                    g["gate"],
                    "PASS" if g["pass"] else "FAIL",
                    measured_text(g["measured"]),
                    "; ".join(g["failing"]) or "-",
                ]
                for g in result["gates"]
            ],
        )
    )


def measured_text(measured: Mapping[str, object]) -> str:
    """A gate's evidence for the text table: each value as compact JSON, except a nested
    value longer than :data:`MEASURED_TEXT_CHARS` (a per-cell scorecard), which reads
    ``"see --json"`` so one gate cannot widen the table to thousands of characters."""
    shown: dict[str, object] = {}
    for key, value in measured.items():
        text = json.dumps(value)
        big = isinstance(value, dict | list) and len(text) > MEASURED_TEXT_CHARS
        shown[key] = "see --json" if big else value
    return json.dumps(shown)


def render_oracle(rows: list[dict]) -> str:
    """Smart's served fraction against the bounds, one line per fleet size and seed."""
    table = []
    for r in rows:
        exact = r.get("oracle_exact")
        table.append(
            [
                r["machines"],
                r["seed"],
                r["smart"],
                r["capacity_bound"],
                r["gap_to_capacity_bound"],
                r.get("oracle_schedule", "-"),
                "-" if exact is None else ("exhaustive" if exact else "beam"),
                r.get("gap_to_oracle_schedule", "-"),
                r.get("oracle_bound", "-"),
                r.get("gap_to_oracle_bound", "-"),
            ]
        )
    return render_table(
        [
            "machines",
            "seed",
            "smart served",
            "capacity bound",
            "gap",
            "oracle schedule",
            "search",
            "gap",
            "oracle bound",
            "gap",
        ],
        table,
    )


def _seeds(text: str) -> list[int]:
    """``--seeds`` as integers, each checked before any run starts.

    Raises:
        ValidationError: not a comma-separated list of integers, or a seed out of range.
    """
    seeds = _ints("--seeds", text)
    for seed in seeds:
        check_seed("--seeds", seed)
    return seeds


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        msg = f"{flag}: {text!r} is not a comma-separated list of integers"
        raise ValidationError(msg) from None
    if not values:
        msg = f"{flag}: give at least one value"
        raise ValidationError(msg)
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        # Each (size, seed) cell is one result: a repeat would only run it again.
        msg = f"{flag}: {', '.join(map(str, repeated))} given twice; give each value once"
        raise ValidationError(msg)
    return values


def exact_cmd(
    machines: str = typer.Option("2,4,8,16", "--machines", help="Comma-separated sizes (1-16)."),
    seeds: str = typer.Option("42,144", "--seeds", help="Comma-separated seeds."),
    models: int = typer.Option(9, "--models", help="Catalog models (1-32)."),
    as_json: bool = typer.Option(False, "--json", help="One row per fleet as JSON."),
) -> None:
    """Compare the planner's coverage with the exact optimum (HiGHS) on small lab fleets."""
    from grid_core.api import exact_check, prime_quietly
    from grid_lab.env import lab_env

    sizes = _ints("--machines", machines)
    seed_list = _seeds(seeds)
    rows = []
    try:
        prime_quietly()
        with lab_env() as env:
            for size in sizes:
                for seed in seed_list:
                    rows.append(exact_check(size, models, seed, env.plugins))
    except (ValueError, ValidationError) as exc:
        typer.echo(f"grid: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(rows, sort_keys=True))
        return
    cols = ["machines", "seed", "desired", "placed", "coverage", "optimum", "exact_coverage", "gap"]
    typer.echo(render_table(cols, [[r[c] for c in cols] for r in rows]))
    for r in rows:
        if not r["optimal"]:
            typer.echo(
                f"grid: machines {r['machines']} seed {r['seed']}: the optimum is not proven "
                f"(HiGHS: {r['status']}); its row shows the best plan found",
                err=True,
            )
    worst = max((float(r["gap"]) for r in rows), default=0.0)
    typer.echo(f"grid: worst gap to the optimum {worst:.4f} over {len(rows)} fleet(s)", err=True)
