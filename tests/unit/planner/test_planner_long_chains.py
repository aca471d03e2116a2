"""Long ejection chains: the last search for a replica still short after the settling repair.

Source: specification, "Global placement loop" (bounded deterministic repair that may move
several new replicas). These fleets start from spent shared budgets, as the classes above
leave them on a large fleet, and show what the settling repair cannot place and the long
chains then do.
"""

from __future__ import annotations

import pytest
from planner_helpers import PLUGINS, host, layout_state, model, res, state_where

from grid_core.planner.core import PlanState
from grid_core.planner.exchange import exchange_rounds
from grid_core.planner.longchains import deep_chains, long_chains
from grid_core.planner.repair import repair_class
from grid_core.planner.settle import settle

LADDER_HOSTS = [
    host("h1", 16, max_models=1, tags=("t1", "tb")),
    host("h2", 16, max_models=1, tags=("tb", "tc")),
    host("h3", 16, max_models=1, tags=("tc", "td")),
    host("h4", 16, max_models=1, tags=("td", "te")),
    host("h5", 16, max_models=1, tags=("te",)),
]
"""Five single-slot hosts; each model runs on two neighbours (its required tag)."""
LADDER_MODELS = [
    model("a", 8, priority=0, max_replicas=1, required_tags=("t1",)),
    model("b", 6, priority=2, max_replicas=1, required_tags=("tb",)),
    model("c", 5, priority=2, max_replicas=1, required_tags=("tc",)),
    model("d", 7, priority=1, max_replicas=1, required_tags=("td",)),
    model("e", 4, priority=1, max_replicas=1, required_tags=("te",)),
]
LADDER_LAYOUT = [("b", "h1"), ("c", "h2"), ("d", "h3"), ("e", "h4")]
"""Every slot but the last host's is taken, each by the model that could also move up one
host: the shape of the next replica on 64x32 seed 59 (occupancy 0), a priority-0 model
that gets a host only once four new replicas each move one host on."""


def _state(
    hosts,
    layout,
    *,
    live: tuple[str, str] | None = None,
    models=LADDER_MODELS,
    wanted: dict[str, int] | None = None,
) -> PlanState:
    """:func:`layout_state` with one replica of each model wanted (``wanted`` names other
    counts) and the shared repair budgets spent."""
    counts = wanted or {}
    wants = {m.model_id: counts.get(m.model_id, 1) for m in models}
    return layout_state(hosts, models, layout, wants, live=live)


def _earlier_passes_place_nothing(state: PlanState, *, long: bool = False) -> None:
    """The earlier passes (repair, exchanges, settling, and with ``long`` the long chains)
    leave the state as it is."""
    before = state_where(state)
    repair_class(state, list(range(len(state.profiles))), False)
    assert exchange_rounds(state) == 0
    assert settle(state) == 0
    if long:
        assert long_chains(state) == 0
    assert state_where(state) == before


def _only_long_chains_place(state: PlanState) -> None:
    """The earlier passes leave the state as it is; the long chains then place one
    replica."""
    _earlier_passes_place_nothing(state)
    assert long_chains(state) == 1


def test_a_five_move_chain_places_what_the_settling_repair_cannot():
    # "a" runs only on h1, where "b" sits; "b" can move to h2 once "c" leaves, "c" to h3
    # once "d" leaves, "d" to h4 once "e" leaves, and "e" fits the empty h5. The settling
    # repair's chains stop at four moves, one short.
    state = _state(LADDER_HOSTS, LADDER_LAYOUT)
    _only_long_chains_place(state)
    assert state_where(state) == {("a", "h1"), ("b", "h2"), ("c", "h3"), ("d", "h4"), ("e", "h5")}


DEEP_HOSTS = [
    *LADDER_HOSTS[:4],
    host("h5", 16, max_models=1, tags=("te", "tf")),
    host("h6", 16, max_models=1, tags=("tf",)),
]
"""Six single-slot hosts; each model runs on two neighbours: the ladder one host longer."""
DEEP_MODELS = [
    *LADDER_MODELS[:4],
    model("e", 4, priority=1, max_replicas=1, required_tags=("te",)),
    model("f", 3, priority=0, max_replicas=1, required_tags=("tf",)),
]
DEEP_LAYOUT = [("b", "h1"), ("c", "h2"), ("d", "h3"), ("e", "h4"), ("f", "h5")]


def test_a_six_move_chain_is_left_to_the_deep_pass():
    # As the five-move ladder, one host longer: "a" gets h1 only once five new replicas each
    # move one host on, "f" to the empty h6. The long chains stop at five moves; the deep
    # pass at the end of the plan (up to DEEP_CHAIN_MOVES) places it.
    state = _state(DEEP_HOSTS, DEEP_LAYOUT, models=DEEP_MODELS)
    _earlier_passes_place_nothing(state, long=True)
    assert deep_chains(state) == 1
    assert state_where(state) == {
        ("a", "h1"),
        ("b", "h2"),
        ("c", "h3"),
        ("d", "h4"),
        ("e", "h5"),
        ("f", "h6"),
    }


CLOSING_HOSTS = [
    host("p", 40, tags=("tp", "td", "te")),
    host("q", 16, max_models=1, tags=("td", "te")),
]
"""An open host without a model ceiling and a single-slot host."""
CLOSING_MODELS = [
    model("a", 9, priority=0, max_replicas=1, required_tags=("tp",)),
    model("m", 10, priority=2, max_replicas=1, required_tags=("tp",)),
    model("d", 12, priority=2, max_replicas=1, required_tags=("td",)),
    model("l", 14, priority=2, max_replicas=1, required_tags=("tp",)),
    model("e", 4, priority=1, max_replicas=1, required_tags=("te",)),
]
CLOSING_LAYOUT = [("m", "p"), ("d", "p"), ("l", "p"), ("e", "q")]
"""The open host is full (4 GB free) with three replicas that each make room for "a"; only
the middle-sized one has somewhere to go: the shape of 64x32 seed 79 (occupancy 0)."""


def test_a_chain_through_a_middle_sized_replica_closes_on_the_host_it_started_from():
    # "a" runs only on p. "m" (the smallest that makes room) and "l" (the largest) run
    # nowhere else; "d" moves to q once "e" leaves, and "e" lands back on p beside "a"
    # (4 + 12 - 9 = 7 GB left there). The settling repair tries only "m" and "l".
    state = _state(CLOSING_HOSTS, CLOSING_LAYOUT, models=CLOSING_MODELS)
    _only_long_chains_place(state)
    assert state_where(state) == {("a", "p"), ("m", "p"), ("l", "p"), ("e", "p"), ("d", "q")}


VACATE_HOSTS = [
    host("p", 40, tags=("tp", "tr")),
    host("q1", 12, max_models=1, tags=("tr",)),
    host("q2", 12, max_models=1, tags=("tr",)),
]
"""An open host and two empty single-slot hosts."""
VACATE_MODELS = [
    model("x", 20, priority=0, max_replicas=1, required_tags=("tp",)),
    model("r1", 10, priority=2, max_replicas=1, required_tags=("tr",)),
    model("r2", 10, priority=2, max_replicas=1, required_tags=("tr",)),
    model("r3", 10, priority=1, max_replicas=1, required_tags=("tp",)),
    model("r4", 8, priority=1, max_replicas=1, required_tags=("tp",)),
]
VACATE_LAYOUT = [("r1", "p"), ("r2", "p"), ("r3", "p"), ("r4", "p")]
"""The open host has 2 GB free; "x" needs 20, so no single replica leaving makes room: the
shape of 64x32 seed 80 (occupancy 0), where four replicas leave a 192 GB Mac for a 37 GB
priority-0 model."""


def test_several_replicas_leave_one_host_each_for_a_host_where_it_fits():
    # "r1" and "r2" each fit one of the single-slot hosts; with both gone "x" fits p.
    state = _state(VACATE_HOSTS, VACATE_LAYOUT, models=VACATE_MODELS)
    _only_long_chains_place(state)
    assert state_where(state) == {("x", "p"), ("r3", "p"), ("r4", "p"), ("r1", "q1"), ("r2", "q2")}


SPREAD_HOSTS = [
    host("h1", 16, max_models=1, tags=("ta", "ty"), failure_domain="fd-a"),
    host("h2", 16, max_models=1, tags=("ty", "tz"), failure_domain="fd-b"),
    host("h3", 14, tags=("ty", "tz", "tw"), failure_domain="fd-b"),
    host("h4", 16, max_models=1, tags=("ty", "tw"), failure_domain="fd-a"),
    host("h5", 16, max_models=1, tags=("ty",), failure_domain="fd-b"),
    host("h6", 16, tags=("te", "ty"), failure_domain="fd-c"),
    host("h7", 8, max_models=1, tags=("te",), failure_domain="fd-c"),
]
"""Single-slot hosts in two failure domains, an open host (h3) with one large replica, and
an open host (h6) whose replicas "y" may not join."""
SPREAD_MODELS = [
    model("a", 8, priority=1, max_replicas=1, required_tags=("ta",)),
    model("y", 6, priority=0, max_replicas=3, min_failure_domains=2, required_tags=("ty",)),
    model("z", 5, priority=0, max_replicas=1, required_tags=("tz",)),
    model("w", 12, priority=0, max_replicas=1, required_tags=("tw",)),
    model("e", 4, priority=0, max_replicas=1, required_tags=("te",)),
    model("x", 2, priority=0, max_replicas=1, required_tags=("te",), colocation_excludes=("y",)),
]
SPREAD_LAYOUT = [("y", "h1"), ("z", "h2"), ("w", "h3"), ("y", "h4"), ("y", "h5")]
SPREAD_LAYOUT += [("e", "h6"), ("x", "h6")]
""""y" needs two failure domains and has them: h1 and h4 in fd-a, h5 in fd-b."""


def test_a_long_chain_that_moves_one_model_twice_keeps_its_failure_domains():
    # "a" runs only on h1, where "y" sits. The one chain that makes room: "y" moves from h1
    # to h3 (fd-b) once "w" leaves for h4, which "y" must leave too, for h2 (fd-b) once "z"
    # leaves; "z" closes on h3 beside "y". Every move alone keeps "y" in both domains, but
    # together they leave it only in fd-b, below what it requires: "a" stays short.
    state = _state(SPREAD_HOSTS, SPREAD_LAYOUT, models=SPREAD_MODELS, wanted={"y": 3})
    before = state_where(state)
    assert settle(state) == 0
    assert long_chains(state) == 0
    assert state_where(state) == before
    assert set(state.ledger.domains[state.ledger.index["y"]]) == {"fd-a", "fd-b"}


def test_a_long_chain_never_moves_live_work():
    # The same ladder with "e" live on h4: "d" has nowhere to go, so nothing moves and "a"
    # stays short.
    hosts = list(LADDER_HOSTS)
    hosts[3] = host("h4", 16, max_models=1, tags=("td", "te"), residencies=(res("e", 4),))
    state = _state(hosts, LADDER_LAYOUT[:3], live=("e", "h4"))
    before = state_where(state)
    assert long_chains(state) == 0
    assert state_where(state) == before


SHORTCUT_HOSTS = [
    host("h0", 16, max_models=1, tags=("t1", "tg"), residencies=(res("g", 6),)),
    *LADDER_HOSTS,
    host("h6", 16, max_models=1, tags=("tg",)),
]
"""The ladder, plus a single-slot host "a" may use that holds a live replica of "g", which
could move to the empty h6: a two-move shortcut if live work could move."""
SHORTCUT_MODELS = [*LADDER_MODELS, model("g", 6, priority=2, max_replicas=1, required_tags=("tg",))]


def test_only_a_short_model_moves_new_replicas_and_never_live_ones():
    # With "a" not wanted nothing is short: the pass moves nothing. With one replica of "a"
    # wanted, it is placed by the five-move ladder (the only chain of new replicas), not by
    # moving the live "g" off h0, which stays there, live.
    live = ("g", "h0")
    quiet = _state(
        SHORTCUT_HOSTS, LADDER_LAYOUT, live=live, models=SHORTCUT_MODELS, wanted={"a": 0}
    )
    before = state_where(quiet)
    assert long_chains(quiet) == 0
    assert state_where(quiet) == before

    state = _state(SHORTCUT_HOSTS, LADDER_LAYOUT, live=live, models=SHORTCUT_MODELS)
    _only_long_chains_place(state)
    ladder = {("a", "h1"), ("b", "h2"), ("c", "h3"), ("d", "h4"), ("e", "h5")}
    assert state_where(state) == ladder | {("g", "h0")}
    h0 = next(hi for hi, h in enumerate(state.hosts) if h.host_id == "h0")
    assert state.ledger.books[h0].models[state.ledger.index["g"]].incumbent


WIDE_FILLER = 40
"""Models of the wide part of the fleet, each with one new replica that may move."""
WIDE_HOSTS = [
    *LADDER_HOSTS,
    *(host(f"w{i:03}", 64, tags=("tw",)) for i in range(200)),
]
"""The ladder beside 200 open hosts that every filler model may use: 8,000 more candidate
(model, host) pairs, as on a fleet of a few hundred hosts."""
WIDE_MODELS = [
    *LADDER_MODELS,
    *(
        model(f"f{i:02}", 1, priority=1, max_replicas=1, required_tags=("tw",))
        for i in range(WIDE_FILLER)
    ),
]
WIDE_LAYOUT = [*LADDER_LAYOUT, *((f"f{i:02}", f"w{i:03}") for i in range(WIDE_FILLER))]


def test_a_wide_fleet_gives_the_long_chains_a_budget_that_reaches_the_search():
    # The ladder's five-move chain again, beside a wide part of the fleet: working out
    # where every movable replica could go (where each fits, what each could displace)
    # costs about 16,000 steps here, two per filler pair, more than the 12,000 a small
    # fleet gets. The budget grows with the candidate pairs (8,009 of them: 64,072 steps),
    # so the chain is found and "a" is placed; with the small fleet's budget the pass
    # would stop before its first search and leave "a" short.
    state = _state(WIDE_HOSTS, WIDE_LAYOUT, models=WIDE_MODELS)
    assert long_chains(state) == 1
    where = state_where(state)
    assert {("a", "h1"), ("b", "h2"), ("c", "h3"), ("d", "h4"), ("e", "h5")} <= where
    assert {(f"f{i:02}", f"w{i:03}") for i in range(WIDE_FILLER)} <= where


def test_the_long_chains_never_begin_work_that_could_cross_their_step_limit(monkeypatch):
    # The wide fleet: finding where every movable replica fits costs about 8,000 steps,
    # the first move map about 8,000 more. With a step limit of 10,000 the map is never
    # begun (a crafted fleet of 774,144 candidate pairs once spent 769,436 steps against a
    # budget of 100,000, most of them building that map): the pass stops within the limit,
    # places nothing and leaves the plan as it was.
    from grid_core.planner import longchains

    monkeypatch.setattr(longchains, "LONG_CHAIN_STEP_LIMIT", 10_000)
    state = _state(WIDE_HOSTS, WIDE_LAYOUT, models=WIDE_MODELS)
    before = state_where(state)
    assert long_chains(state) == 0
    assert state_where(state) == before
    assert 0 < state.long_chain_steps <= 10_000

    # the real limit is far above what this fleet needs: the five-move chain is found
    monkeypatch.undo()
    state = _state(WIDE_HOSTS, WIDE_LAYOUT, models=WIDE_MODELS)
    assert long_chains(state) == 1
    assert 10_000 < state.long_chain_steps <= longchains.LONG_CHAIN_STEP_LIMIT


@pytest.mark.parametrize(
    ("fleet", "gain"),
    [("64x32-s85-o0.json", 1), ("64x32-s191-o0.json", 1)],
)
def test_the_chain_budgets_of_a_small_fleet_buy_more_priority_0_replicas(monkeypatch, fleet, gain):
    # Two fresh 64x32 fleets at occupancy 0: with 24,000 steps the long chains and the deep
    # pass find a chain that 12,000 steps, the budgets before the native build halved a
    # plan's CPU, did not; no higher class places fewer.
    from pathlib import Path

    from grid_bench.fleet import fleet_inputs, load_fleet

    import grid_core.planner as planner
    from grid_core.planner import longchains

    inputs = fleet_inputs(load_fleet(Path(__file__).parents[2] / "data/fleets" / fleet))
    prio = {p.model_id: p.priority for p in inputs.profiles}
    hooks = PLUGINS.planner_hooks()

    def by_class() -> list[int]:
        got = planner.plan(inputs, hooks, reuse=False)
        return [sum(prio[a.model_id] == c for a in got.assignments) for c in (3, 2, 1, 0)]

    raised = by_class()
    monkeypatch.setattr(longchains, "LONG_CHAIN_BUDGET", 12_000)
    monkeypatch.setattr(longchains, "DEEP_CHAIN_BUDGET", 12_000)
    before = by_class()
    assert raised[:3] == before[:3]
    assert raised[3] == before[3] + gain
