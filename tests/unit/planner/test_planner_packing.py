"""Packing beyond one greedy pass: ejection chains and re-plans with learned prices.

Source: specification, "Global placement loop" (bounded deterministic repair that may move
several replicas; the future-compatible host set). docs/planner.md, steps 9 and 12.
"""

from __future__ import annotations

from planner_helpers import (
    CHAIN_HOSTS,
    CHAIN_MODELS,
    NOW,
    POLICY,
    cuda_host,
    demand,
    mac_host,
    model,
    res,
    run,
    vllm_model,
)

import grid_core.planner as planner_pkg
from grid_core.planner import PlanInputs, PlannerPolicy, canonical_inputs
from grid_core.planner.chains import place_by_chain
from grid_core.planner.core import PlanState
from grid_core.planner.repair import _repair_one

LAYOUT = [
    ("c8", "a-cuda-1slot"),
    ("g10", "b-cuda-2slot"),
    ("c20", "b-cuda-2slot"),
    ("g4", "m-mac-2slot"),
    ("g6", "m-mac-2slot"),
]
"""A fragmented arrangement of new replicas: "big" (20 GB, any back-end) fits nowhere."""


def _chain_state(hosts=CHAIN_HOSTS) -> PlanState:
    inputs = canonical_inputs(
        PlanInputs(
            now=NOW,
            profiles=tuple(CHAIN_MODELS),
            hosts=tuple(hosts),
            demand={"big": demand("big", 1)},
            policy=POLICY,
        )
    )
    state = PlanState(inputs, [], None)
    by_host = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    for mid, hid in LAYOUT:
        mi, hi = state.ledger.index[mid], by_host[hid]
        if mid not in state.ledger.books[hi].present:
            assert state.ledger.fit_new(mi, hi) is None
            state.ledger.place(mi, hi, "score")
    return state


def _where(state: PlanState) -> set[tuple[str, str]]:
    return {
        (state.profiles[pl.mi].model_id, state.hosts[pl.hi].host_id)
        for pl in state.ledger.placements()
    }


def test_a_four_move_ejection_chain_places_what_one_move_repair_cannot():
    # "big" fits only the single-slot GPU host once its 8 GB CUDA model leaves; that model
    # fits the two-slot GPU host once a 10 GB GGUF replica leaves; that one fits the Mac
    # once its smallest replica (4 GB) moves to the small Mac. Repair by one move (chained
    # once) stops one step short.
    state = _chain_state()
    big = state.ledger.index["big"]
    before = _where(state)
    assert not _repair_one(state, big)
    assert _where(state) == before  # a failed repair leaves the ledger as it was
    assert place_by_chain(state, big)
    assert _where(state) == {
        ("big", "a-cuda-1slot"),
        ("c8", "b-cuda-2slot"),
        ("c20", "b-cuda-2slot"),
        ("g10", "m-mac-2slot"),
        ("g6", "m-mac-2slot"),
        ("g4", "n-mac-1slot"),
    }
    assert state.chain_steps > 0


def test_an_ejection_chain_never_moves_live_work():
    # The same fleet, but "c8" is live on the single-slot GPU host: live work is never
    # displaced to make room, so no chain exists and nothing changes.
    hosts = list(CHAIN_HOSTS)
    hosts[0] = cuda_host("a-cuda-1slot", 22, max_models=1, residencies=(res("c8", 8),))
    state = _chain_state(hosts)
    by_host = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    state.ledger.keep(
        state.ledger.index["c8"], by_host["a-cuda-1slot"], hosts[0].residencies[0], "incumbent"
    )
    before = _where(state)
    assert not place_by_chain(state, state.ledger.index["big"])
    assert _where(state) == before


REPLAN_HOSTS = [
    cuda_host("h0-cuda", 32, max_models=0),
    mac_host("h1-mac", 12, max_models=3),
    cuda_host("h2-cuda-1slot", 24, max_models=1),
]
REPLAN_MODELS = [
    vllm_model("m0", 20, max_replicas=4, priority=2),
    model("m1", 6, max_replicas=4, priority=2),
    model("m2", 4, max_replicas=4, priority=0),
    vllm_model("m3", 8, max_replicas=4, priority=2),
]
REPLAN_DEMAND = [demand("m0", 1), demand("m1", 4), demand("m2", 4), demand("m3", 4)]
HEADROOM = PlannerPolicy(admission_headroom_mb=512, admission_headroom_fraction=0.0)
"""A flat 512 MB admission headroom: the roomy GPU host keeps 3.5 GB, not 4."""


def test_a_replan_with_learned_prices_places_more_of_the_lower_class(monkeypatch):
    # One pass puts "m0" (20 GB, CUDA) on the roomy GPU host and "m3" on both GPU hosts:
    # the roomy host is then memory-bound with 3.5 GB left, the single-slot host slot-bound.
    # Priced from that outcome, the re-plan puts "m0" on the single-slot host instead, and
    # the roomy host holds "m3", "m1" and "m2": as many priority-2 replicas, one more
    # priority-0 replica.
    monkeypatch.setattr(planner_pkg, "MAX_REPLANS", 0)
    monkeypatch.setattr(planner_pkg, "short_models", lambda state: [])  # no held-room re-plan
    monkeypatch.setattr(planner_pkg, "_size_candidate", lambda *args: args[3])  # nor size
    # nor a class trade (a second "m1" in the place of the second "m3" on the roomy GPU host
    # leaves room for "m2" there too)
    monkeypatch.setattr(planner_pkg, "class_trades", lambda state: 0)
    once = run(REPLAN_MODELS, REPLAN_HOSTS, REPLAN_DEMAND, HEADROOM)
    monkeypatch.undo()
    best = run(REPLAN_MODELS, REPLAN_HOSTS, REPLAN_DEMAND, HEADROOM)

    def per_class(p, prio):
        ids = {m.model_id for m in REPLAN_MODELS if m.priority == prio}
        return sum(1 for a in p.assignments if a.model_id in ids)

    assert per_class(best, 2) == per_class(once, 2) == 4
    assert (per_class(once, 0), per_class(best, 0)) == (1, 2)
    assert best.hosts_of("m0") == ("h2-cuda-1slot",)
    assert run(REPLAN_MODELS, REPLAN_HOSTS, REPLAN_DEMAND, HEADROOM) == best  # deterministic


HOLD_HOSTS = [
    cuda_host("a-cuda-3slot", 30, max_models=3),
    cuda_host("b-cuda-1slot", 94, max_models=1),
    cuda_host("c-cuda-3slot", 14, max_models=3),
]
HOLD_MODELS = [
    vllm_model("big", 26, min_replicas=2, max_replicas=2, priority=3),
    vllm_model("small", 8, min_replicas=1, max_replicas=2, priority=3),
    model("gguf", 14, min_replicas=2, max_replicas=2, priority=0),
]
HOLD_DEMAND = [demand("big", 2), demand("small", 2), demand("gguf", 2)]


def test_a_replan_that_holds_room_for_the_short_lower_class_places_it(monkeypatch):
    # The first plans put "big" on both roomy hosts and "small" on the 14 GB host: three
    # priority-3 replicas, and the 14 GB priority-0 "gguf" fits nowhere (4 GB left on the
    # 30 GB host, no slot on the single-slot one, too little memory on the small one). The
    # re-plan that holds room for "gguf" first places "big" once on the single-slot host and
    # "small" on the 30 GB host beside the held room: still three priority-3 replicas, and
    # one "gguf" (the exact optimum: four).
    monkeypatch.setattr(planner_pkg, "short_models", lambda state: [])
    before = run(HOLD_MODELS, HOLD_HOSTS, HOLD_DEMAND, HEADROOM)
    monkeypatch.undo()
    after = run(HOLD_MODELS, HOLD_HOSTS, HOLD_DEMAND, HEADROOM)

    def count(p, ids):
        return sum(1 for a in p.assignments if a.model_id in ids)

    assert count(before, {"big", "small"}) == count(after, {"big", "small"}) == 3
    assert (count(before, {"gguf"}), count(after, {"gguf"})) == (0, 1)
    assert after.hosts_of("gguf") == ("a-cuda-3slot",)
    assert not any(a.reason == "hold" for a in after.assignments)
    assert run(HOLD_MODELS, HOLD_HOSTS, HOLD_DEMAND, HEADROOM) == after  # deterministic


SIZE_HOSTS = [
    cuda_host("a-cuda-1slot", 64, max_models=1),
    cuda_host("b-cuda-2slot", 32, max_models=2),
    cuda_host("c-cuda-1slot", 96, max_models=1),
    cuda_host("d-cuda-3slot", 24, max_models=3),
    cuda_host("e-cuda-3slot", 64, max_models=3),
    mac_host("m-mac-open", 48),
]
SIZE_MODELS = [
    model("big", 37, max_replicas=4, priority=3),
    model("small", 14, max_replicas=4, priority=3),
    model("mid", 23, max_replicas=1, priority=2),
    model("wide", 20, max_replicas=4, priority=0),
]
SIZE_DEMAND = [demand("big", 4), demand("small", 4), demand("mid", 1), demand("wide", 4)]


def test_a_size_priced_candidate_keeps_the_open_mac_for_small_replicas(monkeypatch):
    # Every earlier pass puts a 37 GB "big" replica on the only host without a slot
    # ceiling, the 48 GB Mac: 11 GB are left there, every server slot is taken, and the
    # priority-2 "mid" (23 GB) fits nowhere (seven replicas). The size-priced candidate
    # charges "big" for its size on the Mac (the short models average about 20 GB), so "big"
    # stays on the servers and the fourth "small" goes to the Mac, beside "mid": the same
    # seven priority-3 replicas and one priority-2 replica more. ("wide", priority 0,
    # fits nowhere in either plan; its shortfall is what the earlier passes price.)
    monkeypatch.setattr(planner_pkg, "_size_candidate", lambda *args: args[3])
    # (nor a class trade: a fourth "small" in the place of a "big" on the Mac lets "mid" in)
    monkeypatch.setattr(planner_pkg, "class_trades", lambda state: 0)
    before = run(SIZE_MODELS, SIZE_HOSTS, SIZE_DEMAND)
    monkeypatch.undo()
    after = run(SIZE_MODELS, SIZE_HOSTS, SIZE_DEMAND)

    def per_class(p, prio):
        ids = {m.model_id for m in SIZE_MODELS if m.priority == prio}
        return sum(1 for a in p.assignments if a.model_id in ids)

    assert per_class(before, 3) == per_class(after, 3) == 7
    assert "m-mac-open" in before.hosts_of("big")
    assert (per_class(before, 2), per_class(after, 2)) == (0, 1)
    assert after.hosts_of("mid") == ("m-mac-open",)
    assert "m-mac-open" not in after.hosts_of("big")
    assert run(SIZE_MODELS, SIZE_HOSTS, SIZE_DEMAND) == after  # deterministic


def _book_facts(state: PlanState) -> list[tuple[object, ...]]:
    return [
        (b.inc_free, b.raw_free, b.disk_free, b.extra_mb, b.version, sorted(b.present))
        for b in state.ledger.books
    ]


def test_a_trial_release_of_holds_scores_as_giving_them_back_and_changes_nothing():
    # Holds for "g4" and "g6" fill the two-slot Mac. Asking how "g10" would score there
    # without them must answer what giving the holds back for real says, and leave every
    # host exactly as it was (version included, so cached fits stay valid).
    from grid_core.planner import holds

    state = _chain_state()
    mac = next(hi for hi, h in enumerate(state.hosts) if h.host_id == "m-mac-2slot")
    g4, g6, g10 = (state.ledger.index[m] for m in ("g4", "g6", "g10"))
    for mi in (g4, g6):
        state.ledger.remove(mi, mac)
        holds._put(state, mi, mac)
    assert state.ledger.fit_new(g10, mac) is not None
    facts = _book_facts(state)
    trial = holds._score_without(state, g10, mac, [g4, g6])
    assert _book_facts(state) == facts
    holds._drop(state, g4, mac)
    holds._drop(state, g6, mac)
    assert state.ledger.fit_new(g10, mac) is None
    assert trial == state.score(g10, mac, True)


EXCHANGE_HOSTS = [mac_host("a-mac-open", 40), cuda_host("b-cuda-2slot", 64, max_models=2)]
EXCHANGE_MODELS = [
    model("big", 30, priority=2),
    model("small1", 4, priority=2),
    model("small2", 5, priority=2),
    model("x", 12, priority=0),
    model("y", 11, priority=0),
]
EXCHANGE_LAYOUT = [("big", "a-mac-open"), ("small1", "b-cuda-2slot"), ("small2", "b-cuda-2slot")]
"""The roomy server's two slots hold 9 GB; the open Mac's memory holds one 30 GB replica."""


def test_an_exchange_swaps_a_large_and_a_small_replica_to_place_a_short_model():
    # "x" (12 GB) and "y" (11 GB) fit neither host: 10 GB are left on the Mac, and the
    # server has no slot. Swapping "big" onto the server in place of "small1", which joins
    # "x" on the Mac, places "x" and keeps every other replica; the 24 GB the Mac then has
    # left take "y" directly. (Here a one-move repair would also find a way for "x"; on a
    # large fleet the repair passes spend their budget long before they try such a cycle,
    # which is why the kept plan gets this search of its own.)
    from grid_core.planner.exchange import exchange_rounds

    inputs = canonical_inputs(
        PlanInputs(
            now=NOW,
            profiles=tuple(EXCHANGE_MODELS),
            hosts=tuple(EXCHANGE_HOSTS),
            demand={"x": demand("x", 1), "y": demand("y", 1)},
            policy=POLICY,
        )
    )
    state = PlanState(inputs, [], None)
    by_host = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    for mid, hid in EXCHANGE_LAYOUT:
        state.ledger.place(state.ledger.index[mid], by_host[hid], "score")
    x, y = state.ledger.index["x"], state.ledger.index["y"]
    assert all(state.ledger.fit_new(m, hi) is not None for m in (x, y) for hi in range(2))
    assert exchange_rounds(state) == 2
    assert _where(state) == {
        ("x", "a-mac-open"),
        ("y", "a-mac-open"),
        ("small1", "a-mac-open"),
        ("big", "b-cuda-2slot"),
        ("small2", "b-cuda-2slot"),
    }


BUMP_HOSTS = [
    cuda_host("a-cuda-1slot", 16, max_models=1),
    cuda_host("b-cuda-2slot", 64, max_models=2),
    mac_host("m-mac-open", 40),
]
BUMP_MODELS = [
    model("big", 37, priority=2),
    model("s", 4, priority=2),
    model("t", 5, priority=2),
    model("u", 6, priority=2),
    vllm_model("x", 12, priority=0),
]
BUMP_LAYOUT = [
    ("s", "a-cuda-1slot"),
    ("t", "b-cuda-2slot"),
    ("u", "b-cuda-2slot"),
    ("big", "m-mac-open"),
]
"""Every CUDA slot is taken by small GGUF replicas; the open Mac is full of one large one."""


def test_a_short_model_bumps_a_small_replica_that_then_lands_by_an_exchange():
    # "x" runs only on the GPU hosts, and both have all their slots taken, so it fits
    # nowhere and no exchange applies (an exchange needs a second slot where one leaves).
    # It takes the single-slot host from "s"; "s" fits nowhere directly either (3 GB left
    # on the Mac), but an exchange lands it: "big" moves to the two-slot server in place of
    # "t", and "t" joins "s" on the Mac. Nothing is dropped; "x" gains its replica.
    from grid_core.planner.exchange import exchange_rounds

    inputs = canonical_inputs(
        PlanInputs(
            now=NOW,
            profiles=tuple(BUMP_MODELS),
            hosts=tuple(BUMP_HOSTS),
            demand={"x": demand("x", 1)},
            policy=POLICY,
        )
    )
    state = PlanState(inputs, [], None)
    by_host = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    for mid, hid in BUMP_LAYOUT:
        state.ledger.place(state.ledger.index[mid], by_host[hid], "score")
    x = state.ledger.index["x"]
    assert all(state.ledger.fit_new(x, hi) == "slots" for hi in state.cands[x])
    assert exchange_rounds(state) == 1
    assert _where(state) == {
        ("x", "a-cuda-1slot"),
        ("big", "b-cuda-2slot"),
        ("u", "b-cuda-2slot"),
        ("s", "m-mac-open"),
        ("t", "m-mac-open"),
    }
