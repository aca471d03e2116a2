"""One node-agent run per host id: the pure rule and the registry that applies it."""

from __future__ import annotations

import pytest

from grid_core.errors import ConflictError
from grid_core.hosts import INSTANCE_LAPSE_S, InstanceClaim, instance_verdict
from grid_core.nodeconfig import MAX_HEARTBEAT_INTERVAL_S
from grid_core.wire import Decoded, Heartbeat, NodeRegistration, control_record_id
from grid_server.registry import MAX_INSTANCE_REFUSALS, Registry

HOST = "host-05"
CTL = control_record_id(HOST)
A = "a" * 32
B = "b" * 32


def register(reg: Registry, instance: str | None, now: float) -> None:
    doc = NodeRegistration(host_id=HOST, instance_id=instance)
    reg.register(HOST, CTL, Decoded(doc), now)


def heartbeat(reg: Registry, instance: str | None, now: float) -> None:
    doc = Heartbeat(node_id=CTL, host_id=HOST, instance_id=instance)
    reg.heartbeat(HOST, CTL, Decoded(doc), now)


def test_the_rule_accepts_the_holder_and_senders_without_an_id() -> None:
    held = InstanceClaim(instance_id=A, last_seen=100.0)
    assert instance_verdict(held, A, 100.0 + INSTANCE_LAPSE_S * 5, registration=False) == "accept"
    assert instance_verdict(held, None, 101.0, registration=True) == "accept"
    assert instance_verdict(None, B, 101.0, registration=True) == "take_over"


def test_the_rule_refuses_a_second_run_while_the_holder_reports() -> None:
    held = InstanceClaim(instance_id=A, last_seen=100.0)
    just_before = 100.0 + INSTANCE_LAPSE_S - 0.001
    assert instance_verdict(held, B, just_before, registration=True) == "held"
    assert instance_verdict(held, B, 100.0 + INSTANCE_LAPSE_S, registration=True) == "take_over"


def test_the_rule_never_lets_a_heartbeat_take_a_held_id_over() -> None:
    held = InstanceClaim(instance_id=B, last_seen=100.0)
    long_after = 100.0 + INSTANCE_LAPSE_S * 10
    assert instance_verdict(held, A, long_after, registration=False) == "superseded"


def test_a_second_agent_is_refused_with_the_host_id_and_what_to_do() -> None:
    reg = Registry()
    register(reg, A, 1000.0)
    heartbeat(reg, A, 1010.0)
    with pytest.raises(ConflictError) as err:
        register(reg, B, 1020.0)
    msg = str(err.value)
    assert f"host id '{HOST}'" in msg
    assert "last heard 10 s ago" in msg
    assert "grid allocator node stop" in msg
    assert f"wait {INSTANCE_LAPSE_S - 10:.0f} s" in msg
    assert reg.instances[HOST].instance_id == A
    assert reg.instance_refusals[-1]["verdict"] == "held"
    assert reg.public(1020.0)[0]["instance"] == A[:12]
    heartbeat(reg, A, 1021.0)  # the first keeps serving


def test_a_refusal_never_calls_a_silent_holder_alive() -> None:
    """The holder last reported 40 s ago: past the slowest heartbeat interval an agent may
    use, inside the 60 s lapse. The refusal said it was "still heartbeating"; it now says when
    it was last heard and when the host id frees up."""
    reg = Registry()
    register(reg, A, 1000.0)
    silent = MAX_HEARTBEAT_INTERVAL_S + 10
    with pytest.raises(ConflictError) as err:
        register(reg, B, 1000.0 + silent)
    msg = str(err.value)
    assert "still heartbeating" not in msg
    assert f"(instance {A[:12]})" in msg
    assert f"last heard {silent:.0f} s ago" in msg
    assert "probably stopped" in msg
    assert f"frees up in {INSTANCE_LAPSE_S - silent:.0f} s" in msg
    assert f"wait {INSTANCE_LAPSE_S - silent:.0f} s" in msg
    assert "grid allocator node stop" in msg


def test_a_refusal_for_a_recent_holder_does_not_guess_it_stopped() -> None:
    reg = Registry()
    register(reg, A, 1000.0)
    with pytest.raises(ConflictError) as err:
        register(reg, B, 1002.0)
    msg = str(err.value)
    assert "last heard 2 s ago" in msg and "probably stopped" not in msg
    assert "still heartbeating" not in msg  # not known from one report either
    assert f"frees up in {INSTANCE_LAPSE_S - 2:.0f} s" in msg


def test_after_the_lapse_the_new_run_takes_over_and_the_old_one_is_refused() -> None:
    reg = Registry()
    register(reg, A, 1000.0)
    register(reg, B, 1000.0 + INSTANCE_LAPSE_S)
    assert reg.instances[HOST].instance_id == B
    with pytest.raises(ConflictError, match="superseded"):
        heartbeat(reg, A, 1000.0 + INSTANCE_LAPSE_S + 1)
    with pytest.raises(ConflictError, match="superseded"):
        reg.remove(HOST, CTL, A, 1000.0 + INSTANCE_LAPSE_S + 2)
    assert CTL in reg.records  # the old run could not withdraw the new run's record


def test_a_clean_stop_releases_the_host_id_at_once() -> None:
    reg = Registry()
    register(reg, A, 1000.0)
    reg.remove(HOST, CTL, A, 1001.0)
    register(reg, B, 1002.0)
    assert reg.instances[HOST].instance_id == B


def test_agents_that_send_no_instance_id_are_unchecked() -> None:
    reg = Registry()
    register(reg, None, 1000.0)
    register(reg, None, 1001.0)
    heartbeat(reg, None, 1002.0)
    register(reg, A, 1003.0)
    register(reg, None, 1004.0)
    assert reg.instances[HOST].instance_id == A


def test_refusals_kept_for_status_are_bounded() -> None:
    reg = Registry()
    register(reg, A, 1000.0)
    for i in range(MAX_INSTANCE_REFUSALS + 5):
        with pytest.raises(ConflictError):
            register(reg, f"c{i}", 1001.0)
    assert len(reg.instance_refusals) == MAX_INSTANCE_REFUSALS
    assert reg.instance_refusals[-1]["instance"] == f"c{MAX_INSTANCE_REFUSALS + 4}"


def test_a_lapsed_holder_is_forgotten_when_records_expire() -> None:
    reg = Registry()
    register(reg, A, 1000.0)
    reg.expire(1000.0 + INSTANCE_LAPSE_S)
    assert HOST not in reg.instances


def test_a_restart_on_the_same_state_directory_takes_over_at_once() -> None:
    held = InstanceClaim(instance_id=A, last_seen=100.0)
    assert instance_verdict(held, B, 101.0, registration=True, replaces=A) == "take_over"
    assert instance_verdict(held, B, 101.0, registration=True, replaces="c" * 32) == "held"
    reg = Registry()
    register(reg, A, 1000.0)
    doc = NodeRegistration(host_id=HOST, instance_id=B, replaces_instance_id=A)
    reg.register(HOST, CTL, Decoded(doc), 1001.0)
    assert reg.instances[HOST].instance_id == B


def test_status_shows_the_refused_agents() -> None:
    from rich.console import Console

    from grid_server.cli_render import status_view

    reg = Registry()
    register(reg, A, 1000.0)
    with pytest.raises(ConflictError):
        register(reg, B, 1001.0)
    doc = {"mode": "automatic", "server": {"instance_refusals": reg.instance_refusals}}
    console = Console(width=200, record=True)
    console.print(status_view(doc))
    text = console.export_text()
    assert "Refused node agents" in text
    assert HOST in text and B[:12] in text and A[:12] in text and "held" in text
