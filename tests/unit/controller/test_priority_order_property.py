"""Priority order holds in every repair path: a property test over engine deaths.

A scarce fleet (one model per host, more models than hosts, each model wanting one replica)
with distinct priorities converges to the most important models. Engines then die at random
moments (``kill -9``: the residency is gone) while the fleet keeps converging. The simulated
nodes record every drain that takes served work away for lower-priority work (an eviction
for a beneficiary that is not more important, or an obsolete drain of a model still short
while a less important model is placed on that host); none may ever be recorded, and after
the last repair the served set is again the most important models.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings
from simfleet import SimFleet

from grid_core.profile import ModelProfile

MODEL_MB = 4000
HOST_MB = 6000
"""One model per host: the slot is scarce, so every repair is a priority decision."""


def _converge(fleet: SimFleet, rounds: int) -> None:
    fleet.converge(rounds=rounds, step_s=10.0)


def _served(fleet: SimFleet) -> set[str]:
    return {
        r.model_id
        for n in fleet.nodes.values()
        for r in n.residencies.values()
        if r.state == "ready"
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hosts=st.integers(2, 3),
    priorities=st.lists(st.integers(0, 40), min_size=3, max_size=5, unique=True),
    deaths=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=6),
)
def test_engine_deaths_never_evict_higher_priority_work_for_lower(
    hosts: int, priorities: list[int], deaths: list[tuple[int, int]]
) -> None:
    fleet = SimFleet.uniform(hosts, HOST_MB)
    for h in fleet.nodes:
        fleet.heartbeat(h)
    for i, prio in enumerate(priorities):
        fleet.put_profile(
            ModelProfile(
                model_id=f"m{i}",
                memory_mb=MODEL_MB,
                min_replicas=1,
                priority=prio,
                min_residency_s=0.0,
            )
        )
    fleet.ctl.set_mode("automatic", fleet.now)
    _converge(fleet, 12)
    top = {f"m{i}" for i, _ in sorted(enumerate(priorities), key=lambda t: -t[1])[:hosts]}
    assert _served(fleet) == top and fleet.violations == []
    names = sorted(fleet.nodes)
    for host_index, rounds in deaths:
        node = fleet.nodes[names[host_index % hosts]]
        for model_id in list(node.residencies):
            fleet.engine_dies(node.host_id, model_id)
        _converge(fleet, rounds)
        assert fleet.violations == []
    _converge(fleet, 15)
    assert fleet.violations == []
    assert _served(fleet) == top
