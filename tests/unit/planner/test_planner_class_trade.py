"""Class trade: a new replica of a class gives its place to a short model of the same class
when the classes below then place more.

Source: specification, "Global placement loop" (classes place high to low, fair rounds
inside a class with a partial round's tie broken by attributable harm; bounded deterministic
repair that may re-place new replicas). The fleet is the shape Hypothesis found for the
exact-optimum property (tests/benchmarks/test_plan_exact_property.py): a one-slot 16 GB host
and a 64 GB host without a ceiling. The rounds give the unlimited host to the 40 GB
priority-1 model (larger first) and leave the 5 GB priority-1 model and two priority-0
models out; serving the 5 GB model instead keeps priority 1 at two replicas and lets a
priority-0 model in.
"""

from __future__ import annotations

import copy

from grid_bench.fleet import SCHEMA, fleet_inputs

from grid_core.planner import NO_HOOKS, plan

GB = 1024


def _host(host_id: str, gb: int, max_models: int, domain: str, cuda: bool = False) -> dict:
    return {
        "host_id": host_id,
        "capacity_mb": gb * GB,
        "reserved_mb": 2 * GB,
        "runtimes": ["llama.cpp", "vllm"] if cuda else ["llama.cpp"],
        "backends": ["cuda"] if cuda else ["metal"],
        "failure_domain": domain,
        "tags": ["nvidia"] if cuda else ["apple-silicon"],
        "state": "accepting",
        "max_models": max_models,
        "heartbeat_age_s": 1.0,
        "residencies": [],
    }


def _model(
    model_id: str, gb: int, priority: int, pin: str | None = None, vllm: bool = False, low: int = 0
) -> dict:
    return {
        "model_id": model_id,
        "memory_mb": gb * GB,
        "runtimes": ["vllm"] if vllm else ["llama.cpp"],
        "backends": ["cuda"] if vllm else [],
        "min_replicas": low,
        "max_replicas": max(1, low),
        "priority": priority,
        "min_failure_domains": 1,
        "required_tags": [],
        "pinned_hosts": [pin] if pin else [],
    }


def _demand(model_id: str, rps: float) -> dict:
    return {
        "model_id": model_id,
        "request_rate_per_s": rps,
        "queue_depth": 0,
        "p95_latency_ms": 0.0,
        "service_time_s": 1.0,
    }


FLEET = {
    "schema": SCHEMA,
    "now": 1_767_225_600.0,
    "params": {},
    "hosts": [_host("host-001", 16, 1, "fd-1"), _host("host-002", 64, 0, "fd-2")],
    "models": [
        _model("model-01", 5, 1),
        _model("model-02", 14, 1, pin="host-001"),
        _model("model-03", 2, 0, pin="host-001"),
        _model("model-04", 5, 0),
        _model("model-05", 2, 0, pin="host-001"),
        _model("model-06", 40, 1),
    ],
    "demand": [
        _demand("model-01", 0.5),
        _demand("model-02", 0.5),
        _demand("model-03", 0.0),
        _demand("model-04", 0.5),
        _demand("model-05", 0.5),
        _demand("model-06", 0.5),
    ],
}
"""The 14 GB priority-1 pin does not fit its 16 GB host (2 GB reserved) and lands on the
64 GB one; the 40 GB and the 5 GB priority-1 models cannot both join it there."""


def _placed(fleet: dict) -> set[tuple[str, str]]:
    result = plan(fleet_inputs(fleet), NO_HOOKS, reuse=False)
    return {(a.model_id, a.host_id) for a in result.assignments}


def _per_class(fleet: dict, where: set[tuple[str, str]]) -> dict[int, int]:
    prio = {m["model_id"]: m["priority"] for m in fleet["models"]}
    out: dict[int, int] = {}
    for mid, _ in where:
        out[prio[mid]] = out.get(prio[mid], 0) + 1
    return out


def test_a_large_replica_makes_way_for_a_small_one_of_its_class_when_a_lower_class_gains():
    where = _placed(FLEET)
    # priority 1 still places two replicas (the 14 GB and the 5 GB model, the 40 GB one
    # goes without); the room the 40 GB model leaves takes the 5 GB priority-0 model
    assert ("model-06", "host-002") not in where
    assert {("model-01", "host-002"), ("model-02", "host-002")} <= where
    assert ("model-04", "host-002") in where
    assert _per_class(FLEET, where) == {1: 2, 0: 2}


def test_no_class_trade_takes_the_replica_of_a_more_harmed_model():
    fleet = copy.deepcopy(FLEET)
    for i in (1, 5):  # the 14 GB and the 40 GB priority-1 models now carry more load
        fleet["demand"][i]["request_rate_per_s"] = 2.0
    where = _placed(fleet)
    assert {("model-02", "host-002"), ("model-06", "host-002")} <= where
    assert _per_class(fleet, where) == {1: 2, 0: 1}


def test_a_tie_in_harm_lets_the_count_decide():
    fleet = copy.deepcopy(FLEET)
    fleet["demand"][5]["request_rate_per_s"] = 2.0  # only the 40 GB model is more harmed
    where = _placed(fleet)
    # the 14 GB model, as harmed as the 5 GB one, makes way for it instead
    assert {("model-01", "host-002"), ("model-06", "host-002")} <= where
    assert ("model-02", "host-002") not in where
    assert _per_class(fleet, where) == {1: 2, 0: 2}


def test_no_class_trade_drops_a_configured_baseline_replica_for_demand():
    fleet = copy.deepcopy(FLEET)
    for i in (1, 5):  # their replicas are now baselines, the 5 GB model's would be demand
        fleet["models"][i]["min_replicas"] = 1
    where = _placed(fleet)
    assert {("model-02", "host-002"), ("model-06", "host-002")} <= where
    assert _per_class(fleet, where) == {1: 2, 0: 1}


def test_the_trading_class_may_itself_place_more_where_the_leaving_replica_was():
    # the second fleet Hypothesis found: a 24 GB CUDA-only priority-2 model holds the CUDA
    # host, where a 5 GB one and a second replica of an 11 GB one would both fit
    fleet = {
        "schema": SCHEMA,
        "now": 1_767_225_600.0,
        "params": {},
        "hosts": [_host("host-001", 32, 0, "fd-1", cuda=True), _host("host-002", 32, 0, "fd-2")],
        "models": [
            _model("model-01", 24, 2, vllm=True, low=1),
            _model("model-02", 5, 2, vllm=True, low=1),
            _model("model-03", 11, 2, low=2),
            _model("model-04", 4, 0, low=2),
        ],
        "demand": [_demand(f"model-0{i}", 0.0) for i in range(1, 5)],
    }
    where = _placed(fleet)
    assert ("model-01", "host-001") not in where
    assert {("model-02", "host-001"), ("model-03", "host-001"), ("model-03", "host-002")} <= where
    assert _per_class(fleet, where) == {2: 3, 0: 2}
