"""Per-tick portfolio search time with and without the shared hard-topology context.

Runs the scenario lab's ``smart`` control (the production controller with the portfolio
search) on lab fleets and times every tick's portfolio pass (search, counterfactual plans,
standby proof). "unshared" drops the snapshot's topology context before every plan, which is
what every counterfactual paid before the context existed. Prints the numbers; asserts only
behaviour (both runs decide exactly the same), never time: the machine may be loaded.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from benchsize import by_size
from grid_lab.env import lab_env

import grid_core.planner as planner
from grid_core.planner import topology
from grid_core.portfolio.run import PortfolioPass, TickInputs, TickPortfolio
from grid_core.scenario.config import ScenarioConfig
from grid_core.scenario.run import LabEnv, run_scenario

pytestmark = pytest.mark.benchmark


@dataclass
class _Timer:
    ticks: list[float] = field(default_factory=list)
    plans: int = 0


@contextmanager
def _timed(shared: bool, mp: pytest.MonkeyPatch) -> Iterator[_Timer]:
    timer = _Timer()
    run = PortfolioPass.run

    def timed(
        self: PortfolioPass, inp: TickInputs, plan_of: Callable[..., object]
    ) -> TickPortfolio:
        started = time.perf_counter()
        try:
            return run(self, inp, plan_of)  # type: ignore[arg-type]
        finally:
            timer.ticks.append(time.perf_counter() - started)

    lookup = planner.lookup

    def unshared(inputs: planner.PlanInputs) -> topology.Topology | None:
        timer.plans += 1
        if shared:
            return lookup(inputs)
        topology.clear()  # every plan rebuilds the snapshot's facts from scratch
        return None

    with mp.context() as m:
        m.setattr(PortfolioPass, "run", timed)
        m.setattr(planner, "lookup", unshared)
        topology.clear()
        yield timer
        topology.clear()


def _run(env: LabEnv, machines: int, minutes: int) -> dict[str, object]:
    cfg = ScenarioConfig(machines=machines, models=9, users=100, duration_s=minutes * 60.0, seed=42)
    return run_scenario(cfg, env)


def test_shared_topology_context_search_time(capsys: pytest.CaptureFixture[str]) -> None:
    minutes = by_size(smoke=8, full=30)
    rows = []
    with lab_env() as env:
        for machines in (8, 16):
            reports = {}
            for shared in (False, True):
                with pytest.MonkeyPatch.context() as mp, _timed(shared, mp) as t:
                    reports[shared] = _run(env, machines, minutes)
                ms = sorted(x * 1000 for x in t.ticks)
                rows.append(
                    f"{machines} machines, {'shared' if shared else 'unshared'} context: "
                    f"search p50={statistics.median(ms):.1f}ms "
                    f"p90={ms[int(0.9 * (len(ms) - 1))]:.1f}ms "
                    f"mean={statistics.fmean(ms):.1f}ms over {len(ms)} ticks, "
                    f"{t.plans} plans"
                )
            # Sharing only saves work: the decisions are identical.
            assert reports[True]["demand"] == reports[False]["demand"]
            assert reports[True]["lifecycle"] == reports[False]["lifecycle"]
    with capsys.disabled():
        print("\n" + "\n".join(rows))
