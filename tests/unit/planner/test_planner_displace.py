"""Trades that drop planned (never live) replicas: a short higher-class model displaces
lower-class replicas from a slot-limited host, one replica of a class makes way for two
short models of the same class, and one makes way for two replicas of one short model.

Source: specification, "Global placement loop" (classes place high to low; bounded
deterministic repair that may re-place new replicas). The first fleet is the shape of
64x32 seed 6 (occupancy 0): the 54 GB three-slot Mac that the 45 GB priority-1 model needs
holds a 5 GB priority-2 replica and two priority-0 ones, and the only other host is
slot-full with priority-0 replicas. The second is the shape of seed 162's priority-0
shortfall: a 16 GB replica holds the memory two small short models would share. The third
is the shape of seed 256: a slot-full server can take a 45 GB replica only once one of its
small replicas leaves the plan. Every repair that only moves replicas (budgets untouched)
leaves all three as they are.
"""

from __future__ import annotations

from planner_helpers import layout_state, mac_host, model, res, state_where

from grid_core.planner import split
from grid_core.planner.core import PlanState
from grid_core.planner.displace import displace_rounds
from grid_core.planner.exchange import exchange_rounds
from grid_core.planner.longchains import long_chains
from grid_core.planner.pairswap import pair_exchange_rounds
from grid_core.planner.repair import repair_class
from grid_core.planner.settle import settle
from grid_core.planner.split import split_rounds
from grid_core.planner.twin import twin_rounds

SEED6_HOSTS = [
    mac_host("a-mac-3slot", 54, max_models=3),
    mac_host("b-mac-2slot", 24, max_models=2),
]
SEED6_MODELS = [
    model("big", 45, priority=1),
    model("m5", 5, priority=2),
    model("p8", 8, priority=0),
    model("p20", 20, priority=0),
    model("q10", 10, priority=0),
    model("q12", 12, priority=0),
]
SEED6_LAYOUT = [
    ("m5", "a-mac-3slot"),
    ("p8", "a-mac-3slot"),
    ("p20", "a-mac-3slot"),
    ("q10", "b-mac-2slot"),
    ("q12", "b-mac-2slot"),
]
""""big" (45 GB) fits the 54 GB Mac only once the 5 GB priority-2 replica and the 20 GB
priority-0 one leave it, and the 24 GB Mac has no slot for the priority-2 one."""


def _no_move_only_pass_places(state: PlanState) -> None:
    """The repair, the exchange, settling, the long chains and the pair exchange leave
    ``state`` as it is."""
    before = state_where(state)
    repair_class(state, list(range(len(state.profiles))), False)
    assert exchange_rounds(state) == 0
    assert settle(state) == 0
    assert long_chains(state) == 0
    assert pair_exchange_rounds(state) == 0
    assert state_where(state) == before


def _seed6_state(
    hosts: list = SEED6_HOSTS, layout: list = SEED6_LAYOUT, models: list = SEED6_MODELS
) -> PlanState:
    wants = {m.model_id: 1 for m in models}
    return layout_state(hosts, models, layout, wants, spent=False)


def test_a_short_higher_class_model_displaces_lower_class_replicas_from_a_slot_limited_host():
    state = _seed6_state()
    _no_move_only_pass_places(state)
    # "big" takes the 54 GB Mac once "m5" and "p20" leave it (the fewest priority-0
    # replicas dropped: "p8" stays); "m5" moves to the small Mac in place of "q10"; "p20"
    # and "q10" leave the plan. Priority 1 gains a replica, priority 2 keeps its one.
    assert displace_rounds(state) == 1
    assert state_where(state) == {
        ("big", "a-mac-3slot"),
        ("p8", "a-mac-3slot"),
        ("m5", "b-mac-2slot"),
        ("q12", "b-mac-2slot"),
    }


def test_a_displacement_never_takes_live_work_and_never_drops_a_higher_class():
    # "p20" live on the large Mac: it stays, so "big" cannot fit there, and nothing changes.
    hosts = list(SEED6_HOSTS)
    hosts[0] = mac_host("a-mac-3slot", 54, max_models=3, residencies=(res("p20", 20),))
    layout = [pair for pair in SEED6_LAYOUT if pair[0] != "p20"]
    state = _seed6_state(hosts, layout)
    by_host = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    state.ledger.keep(
        state.ledger.index["p20"], by_host["a-mac-3slot"], hosts[0].residencies[0], "incumbent"
    )
    before = state_where(state)
    assert displace_rounds(state) == 0
    assert state_where(state) == before
    # The same layout with "big" at priority 0, the lowest class: no class is lower than
    # the short model's, so nothing may leave the plan for it (and "m5", priority 2, is
    # higher).
    state = _seed6_state(models=[model("big", 45, priority=0), *SEED6_MODELS[1:]])
    before = state_where(state)
    assert displace_rounds(state) == 0
    assert state_where(state) == before


SPLIT_HOSTS = [
    mac_host("a-mac-3slot", 24, max_models=3),
    mac_host("c-mac-1slot", 20, max_models=1),
]
SPLIT_MODELS = [
    model("z16", 16, priority=0),
    model("w6", 6, priority=0),
    model("x5", 5, priority=0),
    model("y6", 6, priority=0),
]
SPLIT_LAYOUT = [
    ("z16", "a-mac-3slot"),
    ("w6", "a-mac-3slot"),
    ("z16", "c-mac-1slot"),
]
"""The 24 GB Mac has 2 GB and one slot free, the small Mac none; "x5" and "y6" (short,
priority 0) fit the 24 GB Mac together beside "w6" only once one of "z16"'s two replicas
leaves it."""


def test_one_replica_makes_way_for_two_short_models_of_its_class():
    wants = {"z16": 2, "w6": 1, "x5": 1, "y6": 1}
    state = layout_state(SPLIT_HOSTS, SPLIT_MODELS, SPLIT_LAYOUT, wants, spent=False)
    _no_move_only_pass_places(state)
    assert split_rounds(state) == 1
    assert state_where(state) == {
        ("w6", "a-mac-3slot"),
        ("x5", "a-mac-3slot"),
        ("y6", "a-mac-3slot"),
        ("z16", "c-mac-1slot"),
    }


TWIN_HOSTS = [
    mac_host("a-server-2slot", 100, max_models=2, tags=("t", "u")),
    mac_host("b-mac", 48),
    mac_host("c-mac-1slot", 24, max_models=1, tags=("t",)),
    mac_host("e-mac-1slot", 8, max_models=1, tags=("t",)),
]
TWIN_MODELS = [
    model("w45", 45, priority=2),
    model("f10", 10, priority=0, required_tags=("u",)),
    model("z4", 4, priority=0, max_replicas=2, required_tags=("t",)),
    model("y20", 20, priority=0, max_replicas=2),
    model("v23", 23, priority=0),
]
TWIN_LAYOUT = [
    ("f10", "a-server-2slot"),
    ("z4", "a-server-2slot"),
    ("w45", "b-mac"),
    ("v23", "c-mac-1slot"),
    ("z4", "e-mac-1slot"),
]
"""The server is slot-full with 86 GB free; "y20" (short by two) fits the Mac once "w45"
leaves it and the single-slot host once "v23" leaves it, but neither has anywhere to go,
"f10" runs only on the server and "z4" only on the tagged hosts, all full."""


def test_one_replica_makes_way_for_two_replicas_of_a_short_model():
    wants = {"w45": 1, "f10": 1, "z4": 2, "y20": 2, "v23": 1}
    state = layout_state(TWIN_HOSTS, TWIN_MODELS, TWIN_LAYOUT, wants, spent=False)
    _no_move_only_pass_places(state)
    assert split_rounds(state) == 0
    # "z4" leaves the server (its other replica stays); "w45" moves there and "y20" takes
    # the Mac; "v23" joins it and the second "y20" takes the single-slot host. Priority 2
    # keeps its replica; priority 0 has one more.
    assert twin_rounds(state) == 1
    assert state_where(state) == {
        ("f10", "a-server-2slot"),
        ("w45", "a-server-2slot"),
        ("y20", "b-mac"),
        ("v23", "b-mac"),
        ("y20", "c-mac-1slot"),
        ("z4", "e-mac-1slot"),
    }


def test_a_twin_trade_never_leaves_a_model_beyond_the_replicas_it_needs():
    # "y20" wants one replica and has none. The trade places two of it and drops a "z4"
    # replica; the second "y20" is surplus (its demand asks for one), so it is taken off
    # and the dropped "z4" lands where it was. Before, the plan kept both "y20" replicas
    # and "z4" short (64x32 seeds 34, 116, 121, 140, 165 and 191 kept one or two such
    # surplus priority-0 replicas; the test above did too, "y20" capped at one replica).
    wants = {"w45": 1, "f10": 1, "z4": 2, "y20": 1, "v23": 1}
    state = layout_state(TWIN_HOSTS, TWIN_MODELS, TWIN_LAYOUT, wants, spent=False)
    _no_move_only_pass_places(state)
    assert twin_rounds(state) == 1
    assert state_where(state) == {
        ("f10", "a-server-2slot"),
        ("w45", "a-server-2slot"),
        ("y20", "b-mac"),
        ("v23", "b-mac"),
        ("z4", "c-mac-1slot"),
        ("z4", "e-mac-1slot"),
    }


def test_a_required_baseline_replica_never_makes_way_for_demand_of_its_class():
    # "z16" must keep two replicas (min_replicas 2); "x5" and "y6" only have demand. The
    # baseline round places before the demand rounds, so the split may not undo it.
    models = [
        model("z16", 16, min_replicas=2, max_replicas=4),
        *(model(m.model_id, m.memory_mb / 1024, max_replicas=4) for m in SPLIT_MODELS[1:]),
    ]
    wants = {"z16": 2, "w6": 1, "x5": 1, "y6": 1}
    state = layout_state(SPLIT_HOSTS, models, SPLIT_LAYOUT, wants, spent=False)
    before = state_where(state)
    assert split_rounds(state) == 0
    assert twin_rounds(state) == 0
    assert state_where(state) == before
    # The twin trade: "z4" held at its minimum of two keeps its replica on the server.
    models = [model("z4", 4, priority=0, required_tags=("t",), min_replicas=2, max_replicas=4)]
    models += [m for m in TWIN_MODELS if m.model_id != "z4"]
    wants = {"w45": 1, "f10": 1, "z4": 2, "y20": 2, "v23": 1}
    state = layout_state(TWIN_HOSTS, models, TWIN_LAYOUT, wants, spent=False)
    before = state_where(state)
    assert twin_rounds(state) == 0
    assert state_where(state) == before


def test_a_direct_demand_replica_never_makes_way_for_prewarms_of_its_class():
    # "y20"'s demand is inferred only: the replica of "z4" that real traffic asked for stays.
    wants = {"w45": 1, "f10": 1, "z4": 2, "y20": 2, "v23": 1}
    state = layout_state(
        TWIN_HOSTS, TWIN_MODELS, TWIN_LAYOUT, wants, spent=False, inferred=("y20",)
    )
    before = state_where(state)
    assert twin_rounds(state) == 0
    assert state_where(state) == before


def test_the_split_search_stops_at_its_quick_test_budget(monkeypatch):
    # The quick memory tests are counted too: with none allowed the split makes no trade.
    monkeypatch.setattr(split, "SPLIT_SCAN_BUDGET", 0)
    wants = {"z16": 2, "w6": 1, "x5": 1, "y6": 1}
    state = layout_state(SPLIT_HOSTS, SPLIT_MODELS, SPLIT_LAYOUT, wants, spent=False)
    before = state_where(state)
    assert split_rounds(state) == 0
    assert state_where(state) == before


def test_the_trades_never_leave_a_plan_worse_in_priority_order_than_the_repairs_alone(
    monkeypatch,
):
    """A random 19-host fleet (tests/data/fleets): a displacement placed one priority-1
    replica more, but it took room the long chains and pair exchanges after it would have
    used for two (priority 1: 37 without the trades, 36 with them). The repairs that only
    add now run before the first displacement too, so the trades start from their plan."""
    from pathlib import Path

    from grid_bench.fleet import fleet_inputs, load_fleet
    from planner_helpers import PLUGINS

    import grid_core.planner as planner

    fleet = Path(__file__).parents[2] / "data/fleets/19x28-displace-first.json"
    inputs = fleet_inputs(load_fleet(fleet))
    prio = {p.model_id: p.priority for p in inputs.profiles}

    def by_class() -> list[int]:
        got = planner.plan(inputs, PLUGINS.planner_hooks(), reuse=False)
        return [sum(prio[a.model_id] == c for a in got.assignments) for c in (3, 2, 1, 0)]

    with_trades = by_class()
    for name in ("displace_rounds", "split_rounds", "twin_rounds"):
        monkeypatch.setattr(planner, name, lambda state: 0)
    assert with_trades >= by_class() == [19, 10, 37, 3]


SPREAD_HOSTS = [
    mac_host("a-fd2", 24, max_models=1, failure_domain="fd-2", tags=("tx",)),
    mac_host("c1-fd1", 24, max_models=1, failure_domain="fd-1"),
    mac_host("c2-fd1", 24, max_models=1, failure_domain="fd-1"),
    mac_host("d-fd1", 24, max_models=1, failure_domain="fd-1"),
]
"""One single-slot host in fd-2 (the only one "x" may use) and three in fd-1, one empty."""
SPREAD_MODELS = [
    model("x", 12, priority=1, required_tags=("tx",)),
    model("z", 6, priority=0, max_replicas=3, min_failure_domains=2),
]
SPREAD_LAYOUT = [("z", "a-fd2"), ("z", "c1-fd1"), ("z", "c2-fd1")]
""""z" spans both domains with three replicas, its only fd-2 replica on the host "x" needs."""


def test_a_displacement_never_leaves_a_lower_class_model_below_the_domains_its_replicas_cover():
    # Dropping z's fd-2 replica would leave z two replicas, both in fd-1: fewer domains than
    # it requires although it has the replicas to span them and did. Its failure-domain
    # minimum is a hard rule where feasible, so the trade is not made and "x" stays short
    # (before this rule it was made).
    state = layout_state(SPREAD_HOSTS, SPREAD_MODELS, SPREAD_LAYOUT, {"x": 1, "z": 3}, spent=False)
    assert displace_rounds(state) == 0
    assert state_where(state) == set(SPREAD_LAYOUT)


def test_a_displacement_may_cut_a_lower_class_spread_only_as_far_as_its_count_falls():
    # With two replicas wanted, the fd-2 one leaving leaves one replica: one domain is all
    # one replica can span, so the trade stands (the shape of 64x32 seed 139, where a
    # priority-1 replica takes the host of a priority-0 model's second replica).
    layout = [("z", "a-fd2"), ("z", "c1-fd1")]
    hosts = SPREAD_HOSTS[:2]
    state = layout_state(hosts, SPREAD_MODELS, layout, {"x": 1, "z": 2}, spent=False)
    assert displace_rounds(state) == 1
    assert state_where(state) == {("x", "a-fd2"), ("z", "c1-fd1")}
