"""A staged preemption or relocation names what it frees: the ``resource`` of its unmet row.

Source: specification, "Safety invariants" 10 (a shortfall stays visible with its cause) and
"Global placement loop" (staged preemption and relocation wait for memory, model slots or a
colocation rule to be freed on the chosen host).
"""

from __future__ import annotations

from planner_helpers import host, model, placed, res, run

from grid_core.planner import Plan, Unmet


def _staged(p: Plan, model_id: str) -> list[Unmet]:
    return [u for u in p.unmet if u.model_id == model_id and u.code.endswith("_staged")]


def test_a_preemption_staged_for_memory_names_memory():
    profiles = [model("vip", 8, min_replicas=1, priority=3), model("lo", 8, min_replicas=1)]
    p = run(profiles, [host("a", 8, residencies=(res("lo", 8),))])
    [u] = _staged(p, "vip")
    assert (u.code, u.resource) == ("preemption_staged", "memory")
    assert "to free memory" in u.message


def test_a_preemption_staged_for_a_full_model_slot_names_slots():
    # Plenty of memory, but the host's one model slot is taken by lower-priority work.
    profiles = [model("vip", 4, min_replicas=1, priority=3), model("lo", 4, min_replicas=1)]
    p = run(profiles, [host("a", 64, max_models=1, residencies=(res("lo", 4),))])
    assert [(e.model_id, e.beneficiary) for e in p.evictions] == [("lo", "vip")]
    [u] = _staged(p, "vip")
    assert (u.code, u.resource) == ("preemption_staged", "slots")
    assert "to free a model slot" in u.message and "memory" not in u.message


def test_a_preemption_staged_for_an_exclusion_names_colocation():
    # Room and slots to spare; only vip's exclusion of "lo" keeps it off the host.
    profiles = [
        model("vip", 4, min_replicas=1, priority=3, colocation_excludes=("lo",)),
        model("lo", 4, min_replicas=1),
    ]
    p = run(profiles, [host("a", 64, residencies=(res("lo", 4),))])
    assert [(e.model_id, e.beneficiary) for e in p.evictions] == [("lo", "vip")]
    [u] = _staged(p, "vip")
    assert (u.code, u.resource) == ("preemption_staged", "colocation")
    assert "colocation exclusion" in u.message and "memory" not in u.message


def test_a_pin_waiting_for_staged_evictions_names_what_they_free():
    profiles = [model("keep", 12), model("pinned", 4, pins=("p",)), model("broken", 20)]
    hosts = [
        host("p", 32, residencies=(res("keep", 12), res("broken", 20, "failed"))),
        host("q", 32),
    ]
    p = run(profiles, hosts)
    [u] = p.unmet
    assert (u.code, u.host_id, u.missing, u.resource) == ("preemption_staged", "p", 0, "memory")


def test_a_relocation_staged_for_a_full_model_slot_names_slots():
    # "flex" holds the only cuda host's one slot; moving it to "mac" frees the slot.
    profiles = [
        model("gpu", 4, min_replicas=1, backends=("cuda",)),
        model("flex", 4, min_replicas=1),
    ]
    hosts = [
        host("cuda-1", 64, max_models=1, backends=("cuda",), residencies=(res("flex", 4),)),
        host("mac", 32),
    ]
    p = run(profiles, hosts)
    assert placed(p) == {("flex", "mac")} and p.evictions == ()
    [u] = _staged(p, "gpu")
    assert (u.code, u.host_id, u.resource) == ("relocation_staged", "cuda-1", "slots")
