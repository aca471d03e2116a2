"""The settling repair: what is still short after every other pass, with budgets of its own.

Source: specification, "Global placement loop" (bounded deterministic repair that may move
several new replicas). On oversubscribed fleets the classes above the lowest spend the
shared repair, chain and exchange budgets; these fleets start from that state (budgets
spent) and show what only the settling pass then places.
"""

from __future__ import annotations

from planner_helpers import (
    CHAIN_HOSTS,
    CHAIN_MODELS,
    cuda_host,
    layout_state,
    mac_host,
    model,
    res,
    state_where,
    vllm_model,
)

from grid_core.planner.core import PlanState
from grid_core.planner.exchange import exchange_rounds
from grid_core.planner.repair import repair_class
from grid_core.planner.settle import settle


def _old_passes_place_nothing(state: PlanState) -> None:
    before = state_where(state)
    repair_class(state, list(range(len(state.profiles))), False)
    assert exchange_rounds(state) == 0
    assert state_where(state) == before


SHIFT_HOSTS = [
    cuda_host("a-cuda-1slot", 16, max_models=1),
    mac_host("m-mac-2slot", 16, max_models=2),
]
SHIFT_MODELS = [
    vllm_model("x", 8, priority=0, max_replicas=1),
    model("y", 4, priority=2, max_replicas=1),
    model("z", 6, priority=2, max_replicas=1),
]
SHIFT_LAYOUT = [("y", "a-cuda-1slot"), ("z", "m-mac-2slot")]
"""The only GPU slot holds a small GGUF replica that the Mac has room for."""


def test_a_short_model_takes_a_host_a_new_replica_leaves_for_a_host_with_room():
    # "x" runs only on the GPU host, whose one slot "y" takes; "y" fits the Mac beside "z".
    state = layout_state(SHIFT_HOSTS, SHIFT_MODELS, SHIFT_LAYOUT, {"x": 1, "y": 1, "z": 1})
    _old_passes_place_nothing(state)
    assert settle(state) == 1
    assert state_where(state) == {("x", "a-cuda-1slot"), ("y", "m-mac-2slot"), ("z", "m-mac-2slot")}


def test_settling_never_moves_live_work():
    # The same fleet with "y" live on the GPU host: nothing moves, "x" stays short.
    hosts = list(SHIFT_HOSTS)
    hosts[0] = cuda_host("a-cuda-1slot", 16, max_models=1, residencies=(res("y", 4),))
    state = layout_state(hosts, SHIFT_MODELS, [("z", "m-mac-2slot")], {"x": 1, "y": 1, "z": 1})
    by_host = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    state.ledger.keep(
        state.ledger.index["y"], by_host["a-cuda-1slot"], hosts[0].residencies[0], "incumbent"
    )
    before = state_where(state)
    assert settle(state) == 0
    assert state_where(state) == before


CHAIN_LAYOUT = [
    ("c8", "a-cuda-1slot"),
    ("g10", "b-cuda-2slot"),
    ("c20", "b-cuda-2slot"),
    ("g4", "m-mac-2slot"),
    ("g6", "m-mac-2slot"),
]
"""A fragmented arrangement of new replicas: "big" (20 GB, any back-end) fits nowhere."""


def test_a_four_move_chain_places_a_short_model_after_the_shared_budgets_are_spent():
    # "big" fits only the single-slot GPU host once its 8 GB CUDA model leaves; that model
    # fits the two-slot GPU host once a 10 GB GGUF replica leaves; that one fits the Mac
    # once its 4 GB replica moves to the small Mac. No single move does it.
    state = layout_state(CHAIN_HOSTS, CHAIN_MODELS, CHAIN_LAYOUT, {"big": 1})
    _old_passes_place_nothing(state)
    assert settle(state) == 1
    assert state_where(state) == {
        ("big", "a-cuda-1slot"),
        ("c8", "b-cuda-2slot"),
        ("c20", "b-cuda-2slot"),
        ("g10", "m-mac-2slot"),
        ("g6", "m-mac-2slot"),
        ("g4", "n-mac-1slot"),
    }


CLOSE_HOSTS = [
    cuda_host("a-cuda-2slot", 16, max_models=2, tags=("fast",)),
    mac_host("b-mac-open", 24),
    cuda_host("c-cuda-2slot", 40, max_models=2),
]
CLOSE_MODELS = [
    vllm_model("x", 10, priority=0, max_replicas=1, required_tags=("fast",)),
    model("y", 8, priority=1, max_replicas=1),
    model("z", 20, priority=1, max_replicas=1),
    model("s", 12, priority=1, max_replicas=1),
    vllm_model("w", 4, priority=1, max_replicas=1),
]
CLOSE_LAYOUT = [
    ("y", "a-cuda-2slot"),
    ("z", "b-mac-open"),
    ("s", "c-cuda-2slot"),
    ("w", "c-cuda-2slot"),
]
"""The "fast" GPU host holds "y", the open Mac is full of "z", the other GPU host's two
slots are taken by "s" and "w"."""


def test_a_chain_may_close_on_a_host_it_changed():
    # "x" fits only the "fast" host, once "y" leaves; "y" fits the other GPU host once "w"
    # leaves; "w" runs only on GPU hosts and lands back on the "fast" host, beside "x". A
    # chain that uses each host once cannot end: "w" has nowhere else to go.
    wants = {"x": 1, "y": 1, "z": 1, "s": 1, "w": 1}
    state = layout_state(CLOSE_HOSTS, CLOSE_MODELS, CLOSE_LAYOUT, wants)
    _old_passes_place_nothing(state)
    assert settle(state) == 1
    assert state_where(state) == {
        ("x", "a-cuda-2slot"),
        ("w", "a-cuda-2slot"),
        ("z", "b-mac-open"),
        ("y", "c-cuda-2slot"),
        ("s", "c-cuda-2slot"),
    }


def test_nothing_short_nothing_moves():
    state = layout_state(
        SHIFT_HOSTS, SHIFT_MODELS, [("x", "a-cuda-1slot"), ("y", "m-mac-2slot")], {"x": 1, "y": 1}
    )
    before = state_where(state)
    assert settle(state) == 0
    assert state_where(state) == before
