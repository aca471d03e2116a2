"""Property: on random small fleets Grid's coverage is never far below the exact optimum
(at most 0.16 of the desired replicas, or one replica on the tiniest fleets).

Benchmark tier (HiGHS solves every example; too slow for the unit tier). The optimum is the
lexicographic one Grid must respect (pins first, then priority classes high to low, then the
most replicas): :func:`grid_core.planner.exact.exact_optimum`. Fleets are drawn directly in
the neutral bench format, with model-slot ceilings, two platforms and mixed priorities, so
slots, memory and compatibility all bind somewhere.
"""

from __future__ import annotations

import pytest
from grid_bench.fleet import fleet_inputs, violations
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grid_core.planner import plan
from grid_core.testing import plugins_with

pytestmark = pytest.mark.benchmark
highspy = pytest.importorskip("highspy")

COVERAGE_BOUND = 0.16
"""Grid's coverage may trail the exact optimum's by at most this much on any small fleet, or
by one replica where one replica is more than that (one of six is 0.167).

Measured over 4,600 random fleets (docs/planner.md): never more than two replicas short;
the worst, two of thirteen (0.154), was found by Hypothesis after the bound had been 0.15,
and the planner before ejection chains and re-plans misses the same two. One of the two is
max-min fairness: the optimum needs one priority-2 model at one replica and its peer at
three, where fair rounds give both two (with both at two, at most one fewer fits)."""
PLUGINS = plugins_with(builtins=("grid_scoring", "grid_victims"))
GB = 1024


@st.composite
def small_fleets(draw: st.DrawFn) -> dict:
    n_hosts = draw(st.integers(2, 8))
    n_models = draw(st.integers(1, 6))
    hosts = []
    for i in range(n_hosts):
        cuda = draw(st.booleans())
        hosts.append(
            {
                "host_id": f"host-{i + 1:03d}",
                "capacity_mb": draw(st.sampled_from([16, 24, 32, 64, 96])) * GB,
                "reserved_mb": 2 * GB,
                "runtimes": ["llama.cpp", "vllm"] if cuda else ["llama.cpp"],
                "backends": ["cuda"] if cuda else ["metal"],
                "failure_domain": f"fd-{i % 2 + 1}",
                "tags": ["nvidia"] if cuda else ["apple-silicon"],
                "state": "accepting",
                "max_models": draw(st.sampled_from([0, 1, 1, 2, 3])),
                "heartbeat_age_s": 1.0,
                "residencies": [],
            }
        )
    models, demand = [], []
    for i in range(n_models):
        vllm = draw(st.booleans())
        low = draw(st.integers(0, 2))
        high = draw(st.integers(max(1, low), 4))
        pin = draw(st.sampled_from([None, *[h["host_id"] for h in hosts]]))
        models.append(
            {
                "model_id": f"model-{i + 1:02d}",
                "memory_mb": draw(st.integers(2, 40)) * GB,
                "runtimes": ["vllm"] if vllm else ["llama.cpp"],
                "backends": ["cuda"] if vllm else [],
                "min_replicas": low,
                "max_replicas": high,
                "priority": draw(st.integers(0, 3)),
                "min_failure_domains": 1,
                "required_tags": [],
                "pinned_hosts": [pin] if pin and draw(st.integers(0, 4)) == 0 else [],
            }
        )
        demand.append(
            {
                "model_id": f"model-{i + 1:02d}",
                "request_rate_per_s": draw(st.sampled_from([0.0, 0.5, 2.0, 6.0])),
                "queue_depth": 0,
                "p95_latency_ms": 0.0,
                "service_time_s": 1.0,
            }
        )
    return {
        "schema": "grid-bench-fleet/1",
        "now": 1_767_225_600.0,
        "params": {},
        "hosts": hosts,
        "models": models,
        "demand": demand,
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_fleets())
def test_grid_coverage_is_within_the_bound_of_the_exact_optimum(data: dict) -> None:
    from grid_core.planner.exact import exact_optimum, prime_quietly

    prime_quietly()
    inputs = fleet_inputs(data)
    result = plan(inputs, PLUGINS.planner_hooks(), reuse=False)
    exact = exact_optimum(inputs, time_limit_s=30.0)
    placed = len(result.assignments)
    desired = sum(result.desired.values())
    assert exact.desired == desired
    assert exact.optimal
    assignments = [{"model_id": a.model_id, "host_id": a.host_id} for a in result.assignments]
    assert not any(violations(data, assignments).values())
    # the unordered optimum bounds every plan; the ordered one is what Grid aims for
    assert placed <= exact.unordered
    slack = max(1.0, COVERAGE_BOUND * desired)  # in replicas
    assert placed >= exact.optimum - slack, (placed, exact)
