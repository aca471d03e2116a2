"""The hard-topology context shared by the counterfactual plans of one snapshot.

Specification, "Proactive observation and portfolio planning": counterfactual plans over the
same timestamp, node objects, model profiles and policy share one bounded hard-topology
context; a new heartbeat or profile object invalidates it, demand-only alternatives reuse it.
Sharing must change nothing but cost: the same plans and the same input digest.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from grid_core.demand.types import ModelDemand
from grid_core.planner import NO_HOOKS, PlanInputs, input_digest, plan, topology
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

NOW = 1_790_000_000.0
PROFILES = tuple(
    ModelProfile(model_id=f"m{i}", memory_mb=1_000 + 500 * i, max_replicas=3) for i in range(5)
)


def _hosts() -> tuple[HostSnapshot, ...]:
    return tuple(
        HostSnapshot(
            host_id=f"h{i}",
            capacity_mb=4_000 + 1_000 * i,
            runtimes=("llama.cpp",),
            heartbeat_age_s=1.0,
            max_models=2,
            residencies=(
                ResidencySnapshot(
                    model_id=f"m{i % 5}", memory_mb=1_000 + 500 * (i % 5), state="ready"
                ),
            )
            if i % 2
            else (),
        )
        for i in range(6)
    )


DEMANDS = [
    {f"m{i}": ModelDemand(model_id=f"m{i}", desired_replicas=(i + k) % 3, direct=True)}
    for k in range(4)
    for i in range(5)
]


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    topology.clear()
    yield
    topology.clear()


def _inputs(hosts: tuple[HostSnapshot, ...], demand: dict[str, ModelDemand]) -> PlanInputs:
    return PlanInputs(now=NOW, profiles=PROFILES, hosts=hosts, demand=demand)


def test_demand_only_alternatives_share_one_context_and_plan_exactly_as_without() -> None:
    hosts = _hosts()
    shared = [plan(_inputs(hosts, d), NO_HOOKS, reuse=False) for d in DEMANDS]
    ctx = topology.lookup(_inputs(hosts, {}))
    assert ctx is not None and ctx.builds == len(DEMANDS) and ctx.statics is not None
    alone = []
    for d in DEMANDS:
        topology.clear()
        alone.append(plan(_inputs(hosts, d), NO_HOOKS, reuse=False))
    assert shared == alone
    for d, p in zip(DEMANDS, shared, strict=True):
        assert p.digest == input_digest(_inputs(hosts, d))


def test_a_new_heartbeat_object_gets_a_new_context() -> None:
    hosts = _hosts()
    plan(_inputs(hosts, DEMANDS[0]), NO_HOOKS, reuse=False)
    first = topology.lookup(_inputs(hosts, {}))
    newer = (msgspec.structs.replace(hosts[0], heartbeat_age_s=2.0), *hosts[1:])
    plan(_inputs(newer, DEMANDS[0]), NO_HOOKS, reuse=False)
    second = topology.lookup(_inputs(newer, {}))
    assert first is not None and second is not None and first is not second
    assert second.builds == 1
    # An equal but distinct profile object is a new snapshot too (identity, not equality).
    copied = tuple(msgspec.structs.replace(p) for p in PROFILES)
    assert topology.lookup(PlanInputs(now=NOW, profiles=copied, hosts=newer, demand={})) is None


def test_the_cache_stays_bounded() -> None:
    for k in range(topology.MAX_CONTEXTS + 3):
        hosts = tuple(msgspec.structs.replace(h, heartbeat_age_s=float(k)) for h in _hosts())
        plan(_inputs(hosts, DEMANDS[k]), NO_HOOKS, reuse=False)
    assert len(topology._CONTEXTS) == topology.MAX_CONTEXTS
