"""Registrations, heartbeats and removals advance the safety revision when safety moved.

A heartbeat that only refreshes the lease keeps planning dirty but leaves the safety
revision alone (a steady fleet cannot starve destructive delivery); one that changes a
residency's state, its in-flight activity or the host lifecycle advances it, as do a new
registration and a removal.
"""

from __future__ import annotations

import pytest
from server_testbed import Grid

from grid_core.client import Calls
from grid_core.system import wait_until_sync
from grid_core.wire import AllocatorEnvelope, Heartbeat, Residency, control_record_id

pytestmark = pytest.mark.integration


def _revisions(grid: Grid) -> dict[str, int]:
    # A status call runs under the controller lock, which first applies queued inputs.
    return grid.client.status(detail=False)["controller"]["revisions"]


def _beat(grid: Grid, token: str, host_id: str, **residency: object) -> None:
    rows = [Residency(model_id="m", memory_mb=100, **residency)] if residency else []  # type: ignore[arg-type]  # test rows
    hb = Heartbeat(
        node_id=control_record_id(host_id),
        host_id=host_id,
        allocator=AllocatorEnvelope(residencies=rows),
        request_commands=False,
    )
    grid.node(token).send(Calls.heartbeat(control_record_id(host_id), hb))


def test_registry_inputs_advance_the_safety_revision_only_when_safety_moved(grid: Grid) -> None:
    token = grid.node_token("host-s")
    start = _revisions(grid)
    grid.register_host(token, "host-s")
    after_register = _revisions(grid)
    assert after_register["safety"] > start["safety"]  # new membership

    _beat(grid, token, "host-s")
    same = _revisions(grid)
    assert same["dirty"] > after_register["dirty"] and same["safety"] == after_register["safety"]

    _beat(grid, token, "host-s", state="ready", active_requests=0)
    ready = _revisions(grid)
    assert ready["safety"] > same["safety"]  # a residency appeared

    _beat(grid, token, "host-s", state="ready", active_requests=0)
    assert _revisions(grid)["safety"] == ready["safety"]  # an identical report

    _beat(grid, token, "host-s", state="ready", active_requests=3)
    busy = _revisions(grid)
    assert busy["safety"] > ready["safety"]  # work in flight now

    _beat(grid, token, "host-s", state="ready", active_requests=4)
    assert _revisions(grid)["safety"] == busy["safety"]  # still busy: nothing new for safety

    grid.node(token).send(Calls.remove(control_record_id("host-s")))
    assert wait_until_sync(lambda: _revisions(grid)["safety"] > busy["safety"], timeout_s=10.0)
