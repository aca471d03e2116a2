"""Run one scenario: build the fleet, users and arrivals, drive a control tick by tick.

Per simulated minute: nodes advance (events, READY transitions, deferred removals), the
control plans and orders (the production controller for ``smart``/``reactive``), the minute's
arrivals are served by what is READY, and the bounded request features go back to the
control for its next tick.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grid_core.demand.features import WORKLOADS, RequestFeatures
from grid_core.demand.workloads import projection_map
from grid_core.planner.hooks import PlannerHooks
from grid_core.planner.types import Plan, PlanInputs
from grid_core.plugins import Plugins
from grid_core.profile import ModelProfile
from grid_core.scenario.arrivals import (
    Arrival,
    DemandCurves,
    FleetEvents,
    TraceDigest,
    build_events,
    builtin_mean,
    iter_arrivals,
)
from grid_core.scenario.bound import CapacityBound
from grid_core.scenario.catalog import BASELINE_MODEL, CatalogEntry, build_catalog
from grid_core.scenario.config import TICK_S, ScenarioConfig
from grid_core.scenario.fleet import SimFleet
from grid_core.scenario.personas import PERSONAS, User, build_users, persona_named
from grid_core.scenario.report import SCHEMA_VERSION, Metrics, allocatable_workloads
from grid_core.scenario.scorecard import PrefetchScorecard
from grid_core.scenario.serving import serve_minute
from grid_core.scenario.strategies import (
    ControllerControl,
    GreedyControl,
    StaticControl,
)
from grid_core.scenario.streams import stream
from grid_core.scenario.topology import Machine, build_fleet
from grid_core.store import StateStore

START = 1_767_225_600.0
"""Simulated start (2026-01-01T00:00:00Z): fixed, so reports never depend on the clock."""


@dataclass(frozen=True)
class LabEnv:
    """What the lab needs from outside ``grid_core`` (I/O lives with the caller).

    Attributes:
        plugins: the full plugin set (``smart``, ``greedy``, ``static``, classifier).
        reactive_plugins: the same set without predictive plugins (``reactive``).
        store_factory: a fresh durable controller store per run (automatic mode needs one).
    """

    plugins: Plugins
    reactive_plugins: Plugins
    store_factory: Callable[[], StateStore]


def _plan_fn() -> Callable[[PlanInputs, PlannerHooks], Plan]:
    from grid_core import planner  # late: keeps importing the lab light

    return planner.plan


def _static_mix(users: tuple[User, ...]) -> tuple[dict[str, float], dict[str, float]]:
    """Average requests/s per workload (and per named model) of the declared population."""
    mix: dict[str, float] = {}
    direct: dict[str, float] = {}
    for u in users:
        p = u.persona
        rps = p.rate_per_h / 3600.0 * builtin_mean(p.curve or p.name)
        if p.requested_model != "auto":
            direct[p.requested_model] = direct.get(p.requested_model, 0.0) + rps
        else:
            mix[p.name] = mix.get(p.name, 0.0) + rps
    return mix, direct


Control = ControllerControl | GreedyControl | StaticControl


def make_control(
    cfg: ScenarioConfig, env: LabEnv, profiles: tuple[ModelProfile, ...], users: tuple[User, ...]
) -> Control:
    """The control object for ``cfg.strategy`` (smart/reactive get a fresh durable store)."""
    if cfg.strategy == "smart":
        return ControllerControl("smart", env.plugins, env.store_factory(), profiles, START)
    if cfg.strategy == "reactive":
        return ControllerControl(
            "reactive", env.reactive_plugins, env.store_factory(), profiles, START
        )
    if cfg.strategy == "greedy":
        return GreedyControl(env.plugins, profiles, _plan_fn())
    mix, direct = _static_mix(users)
    return StaticControl(env.plugins, profiles, _plan_fn(), mix, direct)


def run_scenario(cfg: ScenarioConfig, env: LabEnv) -> dict[str, object]:
    """Run one scenario and return its report (JSON-compatible, deterministic).

    Raises:
        ValidationError: a bound of ``cfg`` is violated (names the flag).
    """
    cfg.validate()
    catalog = build_catalog(cfg.models)
    machines = build_fleet(cfg.seed, cfg.machines, catalog, media=cfg.include_comfyui)
    users = build_users(cfg.seed, cfg.users)
    curves = DemandCurves(cfg.traces)
    ticks = cfg.ticks
    digest = TraceDigest()
    kept: list[tuple[Arrival, ...]] = []  # only the oracle keeps the trace (<= 240 minutes)
    events = build_events(cfg.seed, tuple(m.host_id for m in machines), ticks)
    fleet = SimFleet(machines, catalog, events, START)
    profiles = tuple(e.profile for e in catalog)
    control = make_control(cfg, env, profiles, users)
    metrics = Metrics(catalog, machines, allocatable_workloads(catalog, machines))
    scorecard = PrefetchScorecard({p.model_id: p for p in profiles})
    jitter = stream(cfg.seed, "outcomes")
    bound = CapacityBound(catalog, machines, events, cfg.seed)

    def classify(features: RequestFeatures, text: str) -> str | None:
        return env.plugins.classify_request(features, text, WORKLOADS)

    def texts(a: Arrival) -> str:
        return persona_named(a.persona).texts[a.template]

    for tick, batch in enumerate(iter_arrivals(cfg.seed, users, ticks, curves)):
        digest.add(batch)
        if cfg.oracle:
            kept.append(batch)
        changes = fleet.advance(tick)
        step = control.step(fleet)
        fleet.audit_memory()
        results, features, pools = serve_minute(
            fleet, batch, texts, classify, jitter, control.chosen()
        )
        bound.add(tick, results)
        fleet.demanded = {s.model for s in results if s.model} | {
            s.arrival.requested_model for s in results if s.arrival.requested_model != "auto"
        }
        control.observe(features)
        scorecard.record(
            tick,
            step.orders,
            control.predicted(),
            {s.model for s in results if s.model},
            {(h, m) for h, n in fleet.nodes.items() for m in n.residencies},
        )
        # Admission is judged against the model the control chose for each workload (the
        # controller's portfolio), else the best feasible model.
        mapping = {**projection_map(WORKLOADS, profiles, fleet.snapshots()), **control.chosen()}
        metrics.record(tick, changes, step, results, pools, fleet, mapping)
    report: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        **_setup_report(cfg, curves, machines, events, catalog, users),
        "arrivals": {"count": digest.count, "digest": digest.hexdigest()},
        **metrics.report(fleet, cfg.duration_s / 3600.0),
        "prefetch": scorecard.report(),
        "upper_bound": bound.report(),
    }
    if cfg.oracle:
        from grid_core.scenario.oracle import run_oracle

        oracle = run_oracle(
            catalog, machines, tuple(kept), fleet, texts, classify, events, cfg.seed
        )
        served = metrics.total.served
        oracle["strategy_served"] = served
        oracle["gap"] = oracle["ceiling_served"] - served
        oracle["gap_fraction"] = round(oracle["gap"] / max(1, oracle["ceiling_served"]), 6)
        oracle["upper_bound_gap"] = oracle.get("upper_bound_served", served) - served
        report["oracle"] = oracle
    return report


def _setup_report(
    cfg: ScenarioConfig,
    curves: DemandCurves,
    machines: Sequence[Machine],
    events: FleetEvents,
    catalog: Sequence[CatalogEntry],
    users: Sequence[User],
) -> dict[str, object]:
    """The report's description of what ran: scenario options, fleet, events, catalogue and
    user population (JSON-compatible)."""
    return {
        "scenario": {
            "machines": cfg.machines,
            "models": cfg.models,
            "users": cfg.users,
            "duration_s": cfg.duration_s,
            "ticks": cfg.ticks,
            "tick_s": TICK_S,
            "seed": cfg.seed,
            "strategy": cfg.strategy,
            "include_comfyui": cfg.include_comfyui,
            "traces": list(curves.replaced),
            "baseline_model": BASELINE_MODEL,
            "workloads": list(WORKLOADS),
        },
        "fleet": [
            {
                "host_id": m.host_id,
                "class": m.kind.name,
                "failure_domain": m.failure_domain,
                "capacity_mb": m.kind.capacity_mb,
                "runtimes": list(m.kind.runtimes),
                "cached": list(m.cached),
            }
            for m in machines
        ],
        "events": {
            "throttled": list(events.throttled),
            "throttle_ticks": list(events.throttle_ticks),
            "outage": list(events.outage),
            "outage_ticks": list(events.outage_ticks),
        },
        "catalog": [e.model_id for e in catalog],
        "users": {p.name: sum(1 for u in users if u.persona.name == p.name) for p in PERSONAS},
    }
