"""The scenario lab's optimality check: the planner against the exact optimum on small fleets.

For each (machines, seed) the lab builds its own fleet and catalog (:func:`build_fleet`,
:func:`build_catalog`: the heterogeneous logical machines the scenarios run on), asks every
catalog model for a seeded number of replicas, plans once with the production planner and
solves the same :class:`PlanInputs` exactly (:mod:`grid_core.planner.exact`, HiGHS). The
result says how far the planner's coverage is from the optimum a plan could reach.
"""

from __future__ import annotations

from grid_core.demand.types import ModelDemand
from grid_core.planner import PlanInputs, plan
from grid_core.planner.exact import exact_optimum
from grid_core.plugins import Plugins
from grid_core.scenario.arrivals import build_events
from grid_core.scenario.catalog import build_catalog
from grid_core.scenario.fleet import SimFleet
from grid_core.scenario.run import START
from grid_core.scenario.streams import stream
from grid_core.scenario.topology import build_fleet

MAX_MACHINES = 16
"""Small fleets only: the exact solve of a 16-machine lab fleet takes well under a second."""
MAX_WANTED = 2
"""Replicas asked of one model at most: with one model slot per lab machine this already
oversubscribes most small fleets, so the order of placement matters."""


def exact_check(
    machines: int, models: int, seed: int, plugins: Plugins
) -> dict[str, int | float | bool | str]:
    """Plan one small lab fleet and compare its coverage with the exact optimum.

    Args:
        machines: logical machines (1–16).
        models: catalog models (1–32).
        seed: root of the fleet, catalog-demand and event streams.
        plugins: the lab's plugin facade (its planner hooks: score terms, victim selector).

    Returns:
        ``{machines, models, seed, desired, placed, coverage, optimum, exact_coverage, gap,
        optimal, status}``; ``gap`` is the optimum's coverage minus the planner's; when
        ``optimal`` is false the optimum is only the best plan HiGHS found and ``status``
        (HiGHS's model status text, as in :class:`~grid_core.planner.exact.ExactResult`) says why.

    Raises:
        ValueError: ``machines`` or ``models`` is out of range.
        ValidationError: ``highspy`` is not installed.
    """
    if not 1 <= machines <= MAX_MACHINES:
        msg = f"--machines must be 1-{MAX_MACHINES} for the exact check, got {machines}"
        raise ValueError(msg)
    catalog = build_catalog(models)
    fleet_machines = build_fleet(seed, machines, catalog)
    events = build_events(seed, tuple(m.host_id for m in fleet_machines), 1)
    hosts = SimFleet(fleet_machines, catalog, events, START).snapshots()
    rng = stream(seed, "catalog", "exact-check-demand")  # a private sub-stream
    demand = {}
    for entry in catalog:
        p = entry.profile
        want = rng.randint(0, min(MAX_WANTED, p.max_replicas))
        demand[p.model_id] = ModelDemand(model_id=p.model_id, desired_replicas=want, direct=True)
    inputs = PlanInputs(
        now=START, profiles=tuple(e.profile for e in catalog), hosts=hosts, demand=demand
    )
    result = plan(inputs, plugins.planner_hooks(), reuse=False)
    exact = exact_optimum(inputs)
    desired = sum(result.desired.values())
    placed = len(result.assignments)
    coverage = placed / desired if desired else 1.0
    return {
        "machines": machines,
        "models": models,
        "seed": seed,
        "desired": desired,
        "placed": placed,
        "coverage": round(coverage, 4),
        "optimum": exact.optimum,
        "exact_coverage": round(exact.coverage, 4),
        "gap": round(exact.coverage - coverage, 4),
        "optimal": exact.optimal,
        "status": exact.status,
    }
