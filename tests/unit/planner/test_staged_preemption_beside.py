"""A staged preemption never blocks an unrelated model that fits beside it (issue 20).

A higher-priority model preempting a lower-priority one on a host must wait for a later
heartbeat to prove the memory free; meanwhile a small model that fits beside the draining
victim now, and beside the beneficiary afterwards, is placed at once instead of being
reported short of memory for as long as the drain lasts.
"""

from __future__ import annotations

import pytest
from planner_helpers import codes, host, model, placed, res, run


def profiles(beneficiary_gb: int) -> list:
    return [
        model("low", 10, priority=0, max_replicas=1),
        model("high", beneficiary_gb, priority=10, min_replicas=1),
        model("small", 2, priority=0, min_replicas=1),
    ]


@pytest.mark.parametrize("victim_state", ["ready", "draining"])
def test_staged_preemption_never_blocks_a_model_that_fits_beside(victim_state):
    h = host("a", 16, residencies=(res("low", 10, state=victim_state),))
    p = run(profiles(12), [h])
    assert [(e.model_id, e.beneficiary) for e in p.evictions] == [("low", "high")]
    assert codes(p, "high") == ["preemption_staged"]  # still waits for proven free memory
    assert placed(p) == {("small", "a")}  # 10 + 2 now, 12 + 2 afterwards: both fit 16


def test_a_model_that_would_crowd_out_the_beneficiary_waits():
    # 10 + 2 fits now, but 15 + 2 would not fit once the victim is gone: the beneficiary's
    # future footprint is reserved, so the small model is not placed there.
    h = host("a", 16, residencies=(res("low", 10),))
    p = run(profiles(15), [h])
    assert codes(p, "high") == ["preemption_staged"]
    assert ("small", "a") not in placed(p)


def test_the_beneficiary_keeps_its_model_slot():
    h = host("a", 16, max_models=1, residencies=(res("low", 10),))
    p = run(profiles(12), [h])
    assert codes(p, "high") == ["preemption_staged"]
    assert ("small", "a") not in placed(p)


def test_the_beneficiary_is_still_never_assigned_before_memory_is_free():
    h = host("a", 30, residencies=(res("low", 20),))
    p = run([model("low", 20, max_replicas=1), model("high", 12, priority=10, min_replicas=1)], [h])
    assert placed(p) == set()
