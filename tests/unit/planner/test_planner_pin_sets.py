"""Pins that do not all fit on one host: the set reserved is the one that honours the most.

Source: specification, "Global placement loop" (pins reserved first, higher classes before
lower) and issue 17 (the planner aims at the exact optimum's order: pins class by class,
high to low). Found by the random-fleet property test: four priority-0 models pinned to one
16 GB host, where reserving the largest pin first left two that fit together unreserved.
"""

from __future__ import annotations

from planner_helpers import host, model, placed, run

from grid_core.planner import Plan
from grid_core.planner.pinsets import PIN_SET_SEARCH_MAX_PINS
from grid_core.planner.types import Unmet


def _pin_rows(p: Plan, model_id: str) -> list[Unmet]:
    """The model's ``pin_unavailable`` rows."""
    return [u for u in p.unmet if u.model_id == model_id and u.code == "pin_unavailable"]


def test_two_small_pins_are_reserved_where_the_largest_alone_would_fit():
    # A 12 GB host (no headroom): 11 + 2 and 11 + 6 do not fit, 6 + 2 do. The largest first
    # honours one pin; the set honours two.
    p = run(
        [model("p11", 11, pins=("a",)), model("p6", 6, pins=("a",)), model("p2", 2, pins=("a",))],
        [host("a", 12)],
    )
    assert placed(p) == {("p6", "a"), ("p2", "a")}
    [u] = _pin_rows(p, "p11")  # the pin left out still names its resource and its host
    assert (u.resource, u.host_id, u.missing) == ("pin", "a", 1)
    assert "memory" in u.message


def test_a_higher_class_pin_is_kept_over_two_lower_ones():
    # Classes first: one priority-2 pin outranks two priority-0 pins that would fit together.
    p = run(
        [
            model("p11", 11, pins=("a",), priority=2),
            model("p6", 6, pins=("a",)),
            model("p2", 2, pins=("a",)),
        ],
        [host("a", 12)],
    )
    assert placed(p) == {("p11", "a")}
    assert [u.model_id for u in p.unmet if u.code == "pin_unavailable"] == ["p2", "p6"]


def test_model_slots_bound_the_set_and_a_tie_keeps_the_phase_order():
    # Without the two-slot ceiling 6 + 2 + 1 would honour three; with it every best set has
    # two pins, and the phase's own order (largest first) reserves 11 and then 1.
    p = run(
        [
            model("p11", 11, pins=("a",)),
            model("p6", 6, pins=("a",)),
            model("p2", 2, pins=("a",)),
            model("p1", 1, pins=("a",)),
        ],
        [host("a", 12, max_models=2)],
    )
    assert placed(p) == {("p11", "a"), ("p1", "a")}
    rows = [u for u in p.unmet if u.code == "pin_unavailable"]
    assert [(u.model_id, u.resource) for u in rows] == [("p2", "pin"), ("p6", "pin")]
    assert all("slots" in u.message for u in rows)  # the host's ceiling is named


def test_a_left_out_pin_keeps_its_demand_on_other_hosts():
    # The pin is a floor: the 11 GB model's baseline still lands on the other host.
    p = run(
        [
            model("p11", 11, min_replicas=1, pins=("a",)),
            model("p6", 6, pins=("a",)),
            model("p2", 2, pins=("a",)),
        ],
        [host("a", 12), host("b", 12)],
    )
    assert placed(p) == {("p6", "a"), ("p2", "a"), ("p11", "b")}
    [u] = _pin_rows(p, "p11")
    assert (u.resource, u.missing) == ("pin", 0)


def test_a_host_with_more_pins_than_the_bound_keeps_the_phase_order():
    # Beyond the bound nothing is searched: the largest pin is reserved first, as before,
    # with one 1 GB pin beside it (searched, the 6 GB pin and six 1 GB ones would be).
    n = PIN_SET_SEARCH_MAX_PINS - 1  # with the 11 and 6 GB pins: one more than the bound
    small = [model(f"s{i:02d}", 1, pins=("a",)) for i in range(n)]
    p = run(
        [model("p11", 11, pins=("a",)), model("p6", 6, pins=("a",)), *small],
        [host("a", 12)],
    )
    on_a = {m for m, h in placed(p) if h == "a"}
    assert "p11" in on_a and "p6" not in on_a
