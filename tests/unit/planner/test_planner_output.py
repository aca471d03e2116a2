"""Plan output: digest, reuse, refused inputs, the documented worked example and packing
quality rules of issue 17 (slot-aware choice, pins as a floor, unmet reasons).

Source: specification, "Global placement loop"; docs/planner.md.
"""

from __future__ import annotations

import pytest
from planner_helpers import GB, NOW, POLICY, demand, host, model, placed, res, run

from grid_core.planner import PlanInputs, input_digest, plan
from grid_core.testing import plugins_with


def test_digest_is_stable_and_order_independent():
    profiles = [model("a", 4, min_replicas=1), model("b", 4, min_replicas=1)]
    hosts = [host("x", 16), host("y", 16, failure_domain="fd-2")]
    one = PlanInputs(now=NOW, profiles=tuple(profiles), hosts=tuple(hosts), policy=POLICY)
    two = PlanInputs(
        now=NOW, profiles=tuple(reversed(profiles)), hosts=tuple(reversed(hosts)), policy=POLICY
    )
    assert input_digest(one) == input_digest(two)
    hooks = plugins_with().planner_hooks()
    assert plan(one, hooks, reuse=False) == plan(two, hooks, reuse=False)
    later = PlanInputs(now=NOW + 1, profiles=tuple(profiles), hosts=tuple(hosts), policy=POLICY)
    assert input_digest(later) != input_digest(one)


def test_identical_inputs_reuse_the_plan():
    plugins = plugins_with()
    inputs = PlanInputs(
        now=NOW, profiles=(model("a", 4, min_replicas=1),), hosts=(host("x", 16),), policy=POLICY
    )
    assert plan(inputs, plugins.planner_hooks()) is plan(inputs, plugins.planner_hooks())


def test_duplicate_ids_are_refused():
    from grid_core.errors import ValidationError

    with pytest.raises(ValidationError, match="listed twice"):
        run([model("a")], [host("x"), host("x")])


def test_worked_example_of_docs_planner_md():
    def fleet(c_state: str, b_res: tuple = ()):
        return [
            host("mac-a", 24, reserved_mb=6 * GB, residencies=(res("chat", 8),)),
            host("mac-b", 24, reserved_mb=6 * GB, failure_domain="fd-2", residencies=b_res),
            host("gpu-c", 32, failure_domain="fd-2", state=c_state),
        ]

    profiles = [
        model("chat", 8, min_replicas=1, max_replicas=3, min_failure_domains=2, priority=1),
        model("code", 12, min_replicas=1, max_replicas=2, priority=1),
        model("embed", 2, min_replicas=1),
    ]
    wants = [demand("chat", 2, queue_depth=2.0), demand("code", 2)]
    p = run(profiles, fleet("paused"), wants)
    assert placed(p) == {("chat", "mac-a"), ("code", "mac-b"), ("embed", "mac-b")}
    assert sorted((u.model_id, u.code) for u in p.unmet) == [
        ("chat", "capacity_shortage"),
        ("chat", "failure_domain_shortfall"),
        ("code", "capacity_shortage"),
    ]
    later = run(profiles, fleet("accepting", (res("code", 12), res("embed", 2))), wants)
    assert placed(later) == {
        ("chat", "mac-a"),
        ("chat", "gpu-c"),
        ("code", "mac-b"),
        ("code", "gpu-c"),
        ("embed", "mac-b"),
    }
    assert later.unmet == ()


def _cuda(host_id: str, gb: float, **kw: object):
    return host(
        host_id, gb, runtimes=("llama.cpp", "vllm"), backends=("cuda",), tags=("nvidia",), **kw
    )


def test_minimal_slot_case_places_all_five_models():
    # Four single-slot 24 GB CUDA hosts, one 192 GB Mac without a slot ceiling, four 2 GB
    # priority-2 GGUF models and one 12 GB priority-0 CUDA-only model. Slot-blind best fit
    # filled the CUDA hosts with the small models and dropped the CUDA one; the optimum
    # places all five.
    hosts = [_cuda(f"cuda-{i}", 24, max_models=1) for i in range(1, 5)]
    hosts.append(host("mac", 192, backends=("metal",), tags=("apple-silicon",)))
    profiles = [model(f"gguf-{i}", 2, min_replicas=1, priority=2) for i in range(1, 5)]
    profiles.append(
        model("cuda-only", 12, min_replicas=1, priority=0, runtimes=("vllm",), backends=("cuda",))
    )
    p = run(profiles, hosts)
    assert p.unmet == ()
    assert {a.model_id for a in p.assignments} == {m.model_id for m in profiles}
    [cuda_host] = p.hosts_of("cuda-only")
    assert cuda_host.startswith("cuda-")


def test_minimal_slot_case_when_higher_priority_demand_fills_every_slot():
    # Same fleet, but the small models ask for 2 replicas each (8 in all, one per host): the
    # Mac takes 4 and the four CUDA slots the other 4, in priority order.
    hosts = [_cuda(f"cuda-{i}", 24, max_models=1) for i in range(1, 5)]
    hosts.append(host("mac", 192, backends=("metal",), tags=("apple-silicon",)))
    profiles = [model(f"gguf-{i}", 2, max_replicas=2, priority=2) for i in range(1, 5)]
    profiles.append(
        model("cuda-only", 12, min_replicas=1, priority=0, runtimes=("vllm",), backends=("cuda",))
    )
    wants = [demand(f"gguf-{i}", 2) for i in range(1, 5)]
    p = run(profiles, hosts, wants)
    # priority 2 comes first: 4 on the Mac + 4 on the CUDA hosts fill every slot, so the
    # priority-0 model is short, and the reason names the binding resource: model slots.
    assert len(p.assignments) == 8
    [u] = p.unmet
    assert (u.model_id, u.code, u.resource, u.missing) == ("cuda-only", "slot_limit", "slots", 1)


def test_pins_are_a_floor_not_a_ceiling():
    # The pin guarantees a replica on "pinned" (reserved first); demand beyond it (3) is
    # placed on the other eligible hosts.
    hosts = [host("pinned", 16), host("b", 16), host("c", 16), host("d", 16)]
    p = run([model("m", 4, max_replicas=4, pins=("pinned",))], hosts, [demand("m", 3)])
    assert p.desired["m"] == 3
    assert "pinned" in p.hosts_of("m") and len(p.hosts_of("m")) == 3
    assert [a.reason for a in p.assignments if a.host_id == "pinned"] == ["pin"]
    assert p.unmet == ()


def test_pin_is_reserved_before_other_demand_takes_its_host():
    # "other" is more important and would fit the pinned host too, but the pin is first.
    hosts = [host("pinned", 8), host("b", 8)]
    p = run(
        [
            model("m", 6, pins=("pinned",)),
            model("other", 6, min_replicas=2, max_replicas=2, priority=3),
        ],
        hosts,
    )
    assert ("m", "pinned") in placed(p)
    assert [(u.model_id, u.resource) for u in p.unmet] == [("other", "memory")]


def test_pin_floor_respects_tags_beyond_the_pin():
    # Demand beyond the pin may only use hosts the profile's tags allow.
    hosts = [
        host("pinned", 16, tags=("gpu",)),
        host("tagged", 16, tags=("gpu",)),
        host("plain", 16),
    ]
    p = run(
        [model("m", 4, max_replicas=3, pins=("pinned",), required_tags=("gpu",))],
        hosts,
        [demand("m", 3)],
    )
    assert set(p.hosts_of("m")) == {"pinned", "tagged"}
    [u] = p.unmet
    assert (u.code, u.resource, u.missing) == ("host_shortage", "tags", 1)


def test_unmet_reason_names_slots_when_memory_is_free():
    # Plenty of memory, one slot per host: the shortfall is about model slots, not memory.
    hosts = [host("a", 64, max_models=1), host("b", 64, max_models=1)]
    p = run(
        [model("x", 4, min_replicas=2, max_replicas=2, priority=1), model("y", 4, min_replicas=1)],
        hosts,
    )
    [u] = p.unmet
    assert (u.model_id, u.code, u.resource) == ("y", "slot_limit", "slots")
    assert "model slots" in u.message


def test_unmet_reason_names_runtime_when_no_host_can_run_the_model():
    hosts = [host("a", 64), host("b", 64)]
    p = run([model("v", 4, min_replicas=1, runtimes=("vllm",))], hosts)
    [u] = p.unmet
    assert (u.code, u.resource) == ("no_eligible_host", "runtime")
