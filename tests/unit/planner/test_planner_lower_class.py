"""The lower-class-aware candidate: a last plan whose upper classes pay for the hosts the
short lower classes need.

Source: specification, "Global placement loop" (the future-compatible host set; bounded
deterministic repair). docs/planner.md, "Lower-class-aware candidate plan".
"""

from __future__ import annotations

from grid_bench.fleet import SCHEMA, fleet_inputs
from planner_helpers import PLUGINS

import grid_core.planner as planner_pkg
from grid_core.planner import Plan, plan

GB = 1024


def _host(host_id: str, gb: int, reserved_gb: int, cuda: bool, domain: str, slots: int, **kw):
    return {
        "host_id": host_id,
        "capacity_mb": gb * GB,
        "reserved_mb": reserved_gb * GB,
        "runtimes": ["llama.cpp", "vllm"] if cuda else ["llama.cpp"],
        "backends": ["cuda"] if cuda else ["metal"],
        "failure_domain": domain,
        "tags": [],
        "state": kw.get("state", "accepting"),
        "max_models": slots,
        "heartbeat_age_s": 1.0,
        "residencies": [],
    }


def _model(model_id: str, mb: int, priority: int, lo: int, hi: int, domains: int, rt: str = ""):
    return {
        "model_id": model_id,
        "memory_mb": mb,
        "runtimes": [rt] if rt else ["llama.cpp", "vllm"],
        "backends": ["cuda"] if rt == "vllm" else [],
        "min_replicas": lo,
        "max_replicas": hi,
        "priority": priority,
        "min_failure_domains": domains,
    }


def _demand(model_id: str, rate: float, service_s: float) -> dict[str, object]:
    return {
        "model_id": model_id,
        "request_rate_per_s": rate,
        "service_time_s": service_s,
        "queue_depth": 0.0,
        "p95_latency_ms": 0.0,
    }


FLEET = {
    "schema": SCHEMA,
    "now": 1767225600.0,
    "hosts": [
        _host("mac-a-4slot", 96, 12, False, "fd-1", 4),
        _host("mac-b-2slot", 32, 8, False, "fd-2", 2),
        _host("cuda-c-3slot", 96, 2, True, "fd-3", 3),
        _host("mac-d-3slot", 64, 10, False, "fd-2", 3),
        _host("cuda-e-2slot", 32, 1, True, "fd-3", 2),
        _host("cuda-f-2slot", 64, 2, True, "fd-2", 2),
        _host("cuda-g-3slot", 96, 2, True, "fd-3", 3, state="throttled"),
    ],
    "models": [
        _model("m02", 19163, 2, 1, 3, 1, "llama.cpp"),
        _model("m05", 39662, 1, 1, 5, 3, "llama.cpp"),
        _model("m06", 5602, 0, 0, 2, 1, "vllm"),
        _model("m07", 19141, 1, 2, 7, 2),
        _model("m08", 8681, 1, 1, 1, 2, "vllm"),
    ],
    "demand": [
        _demand("m02", 0.7272, 2.454),
        _demand("m05", 2.5245, 3.066),
        _demand("m06", 4.096, 1.054),
        _demand("m07", 4.0657, 1.834),
        _demand("m08", 1.2571, 1.334),
    ],
}
"""Four GPU servers and three Macs, all with model ceilings (shrunk from a generated
12-host fleet): the priority-0 vLLM-only "m06" needs a GPU server slot."""


def _placed(fleet: dict[str, object], result: Plan) -> dict[int, int]:
    """Replicas ``result`` places per priority class of ``fleet``'s models."""
    prio = {m["model_id"]: m["priority"] for m in fleet["models"]}  # type: ignore[attr-defined]
    out: dict[int, int] = {}
    for a in result.assignments:
        out[prio[a.model_id]] = out.get(prio[a.model_id], 0) + 1
    return out


def test_the_lower_class_candidate_places_the_short_priority_zero_replica(monkeypatch):
    # Every earlier plan gives the 2-slot GPU server "cuda-e" to the priority-1 vLLM model
    # "m08" (beside an "m07") and the priority-2 "m02" a slot on the throttled 3-slot GPU
    # server, so the second "m06" (priority 0, vLLM only) finds no GPU slot: 15 replicas.
    # In the candidate the upper classes pay for the GPU slots "m06" still needs: "m08"
    # takes the throttled server, "m02" a Mac slot, and "m06" gets "cuda-e": 16, the exact
    # optimum, with priorities 2 and 1 placing as many as before.
    hooks = PLUGINS.planner_hooks()
    monkeypatch.setattr(planner_pkg, "_lower_class_candidate", lambda c, t, s, best: best)
    before = plan(fleet_inputs(FLEET), hooks, reuse=False)
    monkeypatch.undo()
    after = plan(fleet_inputs(FLEET), hooks, reuse=False)

    assert (len(before.assignments), len(after.assignments)) == (15, 16)
    assert _placed(FLEET, before) == {2: 3, 1: 11, 0: 1}
    assert _placed(FLEET, after) == {2: 3, 1: 11, 0: 2}
    assert sorted(after.hosts_of("m06")) == ["cuda-e-2slot", "cuda-g-3slot"]
    assert plan(fleet_inputs(FLEET), hooks, reuse=False) == after  # deterministic


def _queued(model_id: str, rate: float, service_s: float, queue: float) -> dict[str, object]:
    return {**_demand(model_id, rate, service_s), "queue_depth": queue}


FINISH_FLEET = {
    "schema": SCHEMA,
    "now": 1767225600.0,
    "hosts": [
        _host("host-002", 24, 6, False, "fd-2", 2),
        _host("host-004", 96, 2, True, "fd-4", 3),
        _host("host-006", 192, 4, True, "fd-2", 6),
        _host("host-008", 96, 2, True, "fd-4", 3, state="throttled"),
        _host("host-015", 24, 6, False, "fd-3", 2),
        _host("host-021", 192, 16, False, "fd-1", 0),
        _host("host-023", 192, 16, False, "fd-3", 0),
        _host("host-030", 96, 2, True, "fd-2", 3),
        _host("host-032", 64, 2, True, "fd-4", 2, state="throttled"),
        _host("host-034", 96, 2, True, "fd-2", 3),
        _host("host-035", 24, 1, True, "fd-3", 1),
        _host("host-036", 192, 4, True, "fd-4", 6),
    ],
    "models": [
        _model("model-02", 15742, 2, 0, 6, 1, "vllm"),
        _model("model-03", 33886, 2, 1, 4, 1, "llama.cpp"),
        _model("model-04", 13594, 1, 1, 1, 1, "llama.cpp"),
        _model("model-06", 5182, 1, 1, 6, 1, "llama.cpp"),
        _model("model-07", 21887, 1, 1, 5, 2, "llama.cpp"),
        _model("model-08", 12917, 1, 1, 11, 3, "llama.cpp"),
        _model("model-10", 8674, 1, 0, 8, 1, "llama.cpp"),
        _model("model-12", 43235, 3, 1, 5, 2, "llama.cpp"),
        _model("model-18", 14685, 0, 2, 3, 2, "llama.cpp"),
        _model("model-21", 22586, 2, 1, 2, 1, "llama.cpp"),
        _model("model-22", 22843, 2, 1, 3, 1, "llama.cpp"),
        _model("model-24", 3066, 1, 2, 5, 2, "llama.cpp"),
        _model("model-25", 9227, 3, 0, 1, 1),
        _model("model-30", 9434, 2, 1, 4, 1, "llama.cpp"),
    ],
    "demand": [
        _queued("model-02", 2.0388, 1.941, 0),
        _queued("model-03", 1.1978, 3.421, 0),
        _queued("model-04", 0.4693, 1.896, 0),
        _queued("model-06", 8.1748, 1.145, 3),
        _queued("model-07", 1.7963, 2.201, 0),
        _queued("model-08", 9.6604, 1.6, 0),
        _queued("model-10", 5.1524, 1.372, 0),
        _queued("model-12", 0.6385, 4.925, 0),
        _queued("model-18", 1.2302, 1.434, 0),
        _queued("model-21", 1.1727, 2.448, 0),
        _queued("model-22", 0.6729, 2.663, 1),
        _queued("model-24", 7.31, 0.548, 0),
        _queued("model-25", 1.1401, 2.502, 0),
        _queued("model-30", 3.4462, 0.98, 2),
    ],
}
"""Twelve hosts, two of them 192 GB Macs without a model ceiling (shrunk from the generated
64x32 fleet, seed 39): the priority-0 "model-18" needs two replicas in two domains."""


def test_the_lower_class_candidate_finishes_its_lowest_class(monkeypatch):
    # Right after its solve the candidate has fewer priority-0 replicas than the kept plan
    # (whose count already includes its exchanges and settling); abandoned there, the plan
    # keeps one "model-18" (52 replicas). Finished, its own exchanges and settling place
    # the second on the other large Mac: 53, every higher class as many as before.
    hooks = PLUGINS.planner_hooks()
    real = planner_pkg.behind

    def abandon_in_lowest(alt, base, done):  # the rule before: any finished class counts
        alt.finish_lowest = False
        return real(alt, base, done)

    # The long chains, the pair exchanges and the deep chains that end every plan find the
    # same replica on this fleet by other routes; left out of both plans so that the rule
    # under test is all that differs.
    monkeypatch.setattr(planner_pkg, "long_chains", lambda state: 0)
    monkeypatch.setattr(planner_pkg, "deep_chains", lambda state: 0)
    monkeypatch.setattr(planner_pkg, "pair_exchange_rounds", lambda state: 0)
    monkeypatch.setattr(planner_pkg, "behind", abandon_in_lowest)
    before = plan(fleet_inputs(FINISH_FLEET), hooks, reuse=False)
    monkeypatch.setattr(planner_pkg, "behind", real)
    after = plan(fleet_inputs(FINISH_FLEET), hooks, reuse=False)

    assert (len(before.assignments), len(after.assignments)) == (52, 53)
    assert _placed(FINISH_FLEET, before) == {3: 6, 2: 19, 1: 26, 0: 1}
    assert _placed(FINISH_FLEET, after) == {3: 6, 2: 19, 1: 26, 0: 2}
    assert sorted(after.hosts_of("model-18")) == ["host-021", "host-023"]
    assert plan(fleet_inputs(FINISH_FLEET), hooks, reuse=False) == after  # deterministic
