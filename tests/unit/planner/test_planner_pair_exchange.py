"""Pair exchange: one large new replica trades places with two smaller ones to place a short model.

Source: specification, "Global placement loop" (bounded deterministic repair that may move
several new replicas; model slots are a hard limit). The fleet is the shape of 64x32 seed 162
(occupancy 0): a 45 GB replica alone on a three-slot 54 GB Mac strands two slots, while an
84 GB four-slot Mac is slot-full with medium replicas. Every earlier repair pass, with its
budget untouched, leaves it as it is.
"""

from __future__ import annotations

from planner_helpers import layout_state, mac_host, model, res, state_where

from grid_core.planner.core import PlanState
from grid_core.planner.exchange import exchange_rounds
from grid_core.planner.longchains import long_chains
from grid_core.planner.pairswap import pair_exchange_rounds
from grid_core.planner.repair import repair_class
from grid_core.planner.settle import settle

PAIR_HOSTS = [
    mac_host("a-mac-3slot", 54, max_models=3),
    mac_host("b-mac-4slot", 84, max_models=4),
]
PAIR_MODELS = [
    model("big", 45, priority=1),
    model("m13", 13, priority=2),
    model("m18", 18, priority=2),
    model("m21", 21, priority=2),
    model("m22", 22, priority=2),
    model("x", 10, priority=0),
]
PAIR_LAYOUT = [
    ("big", "a-mac-3slot"),
    ("m13", "b-mac-4slot"),
    ("m18", "b-mac-4slot"),
    ("m21", "b-mac-4slot"),
    ("m22", "b-mac-4slot"),
]
"""9 GB and two slots free on the small Mac, 10 GB and no slot on the large one: "x" (10 GB)
fits neither. One replica leaving the large Mac frees at most 22 GB of the 35 "big" lacks
there, so no one-for-one exchange, chain or vacating move places it."""


def _state(layout=PAIR_LAYOUT, hosts=PAIR_HOSTS, models=PAIR_MODELS) -> PlanState:
    wants = {m.model_id: 1 for m in models}
    return layout_state(hosts, models, layout, wants, spent=False)


def _no_other_pass_places(state: PlanState) -> None:
    """The repair, the exchange, settling and the long chains leave ``state`` as it is."""
    before = state_where(state)
    repair_class(state, list(range(len(state.profiles))), False)
    assert exchange_rounds(state) == 0
    assert settle(state) == 0
    assert long_chains(state) == 0
    assert state_where(state) == before


def test_a_large_replica_trades_places_with_two_smaller_ones_to_place_a_short_model():
    state = _state()
    _no_other_pass_places(state)
    # "big" goes to the large Mac once "m13" and "m22" (35 GB) leave it; both join "x" on the
    # small Mac (45 of 54 GB, three slots). Every other replica stays; "x" gains one.
    assert pair_exchange_rounds(state) == 1
    assert state_where(state) == {
        ("x", "a-mac-3slot"),
        ("m13", "a-mac-3slot"),
        ("m22", "a-mac-3slot"),
        ("big", "b-mac-4slot"),
        ("m18", "b-mac-4slot"),
        ("m21", "b-mac-4slot"),
    }


def test_a_pair_exchange_never_moves_live_work():
    # The same fleet with "big" live on the small Mac: it stays, and "x" stays short.
    hosts = list(PAIR_HOSTS)
    hosts[0] = mac_host("a-mac-3slot", 54, max_models=3, residencies=(res("big", 45),))
    state = _state(PAIR_LAYOUT[1:], hosts)
    by_host = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    state.ledger.keep(
        state.ledger.index["big"], by_host["a-mac-3slot"], hosts[0].residencies[0], "incumbent"
    )
    before = state_where(state)
    assert pair_exchange_rounds(state) == 0
    assert state_where(state) == before


WIDE_HOSTS = [
    mac_host("a-mac-3slot", 54, max_models=3, tags=("xa",)),
    mac_host("b-mac-4slot", 96, max_models=4, tags=("fast",)),
    mac_host("c-mac-1slot", 20, max_models=1, tags=("fast",)),
]
WIDE_MODELS = [
    model("big", 45, priority=1),
    model("s13", 13, priority=2),
    model("t18", 18, priority=2, required_tags=("fast",)),
    model("t21", 21, priority=2, required_tags=("fast",)),
    model("s22", 22, priority=2, required_tags=("fast",)),
    model("r8", 8, priority=2, required_tags=("fast",)),
    model("x", 10, priority=0, required_tags=("xa",)),
]
WIDE_LAYOUT = [
    ("big", "a-mac-3slot"),
    ("s13", "b-mac-4slot"),
    ("t18", "b-mac-4slot"),
    ("t21", "b-mac-4slot"),
    ("s22", "b-mac-4slot"),
    ("r8", "c-mac-1slot"),
]
"""As above, but only "s13" of the large Mac's replicas may run on the small one, so no
pair can join "x" there; "t18" can leave only by taking the single-slot host from "r8"."""


def test_a_wide_pair_exchange_lands_a_member_in_place_of_a_replica_that_joins_the_large_one():
    state = _state(WIDE_LAYOUT, WIDE_HOSTS, WIDE_MODELS)
    _no_other_pass_places(state)
    # "big" goes to the large Mac once "s13" and "t18" leave it; "s13" joins "x", "t18"
    # fits nowhere directly and takes the single-slot host, whose "r8" (8 GB) joins "big"
    # in the large Mac's last slot (96 of 96 GB).
    assert pair_exchange_rounds(state) == 1
    assert state_where(state) == {
        ("x", "a-mac-3slot"),
        ("s13", "a-mac-3slot"),
        ("big", "b-mac-4slot"),
        ("t21", "b-mac-4slot"),
        ("s22", "b-mac-4slot"),
        ("r8", "b-mac-4slot"),
        ("t18", "c-mac-1slot"),
    }
