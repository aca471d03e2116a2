"""Command admission and fencing: host, executable, term, controller id, TTL, generation."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core.protection import ProtectionDecision
from grid_core.runtime import ChildRecord
from grid_core.wire import Acknowledgement, Command
from grid_node.admission import authority_deadline, check, remember_authority
from grid_node.state import NodeState, Receipt

OK = ProtectionDecision(
    state="accepting", reason="", sensor_state="accepting", sensor_reason="", raw_state="accepting"
)
PAUSED = ProtectionDecision(
    state="paused",
    reason="battery 12%",
    sensor_state="paused",
    sensor_reason="battery 12%",
    raw_state="paused",
)


def cmd(**kw) -> Command:
    base = {
        "action_id": "a1",
        "kind": "warm",
        "node_id": "host-a",
        "model_id": "m",
        "plan_generation": "ep:00000000000000000005:x",
        "controller_term": 3,
        "controller_id": "c1",
        "executable": True,
    }
    return Command(**{**base, **kw})


def verdict(
    c: Command, state: NodeState | None = None, *, now=10.0, deadline=20.0, decision=OK
) -> str | None:
    return check(
        c,
        host_id="host-a",
        node_id="ctl.host-a",
        state=state or NodeState(host_id="host-a"),
        deadline_mono=deadline,
        now_mono=now,
        decision=decision,
    )


def test_accepts_a_valid_command_for_this_host_by_host_or_record_id():
    assert verdict(cmd()) is None
    assert verdict(cmd(node_id="ctl.host-a")) is None


def test_rejects_other_host_and_recommendations():
    assert "host-b" in verdict(cmd(node_id="host-b"))
    assert "recommendation" in verdict(cmd(executable=False))


def test_term_fencing_survives_as_state():
    state = NodeState(host_id="host-a")
    remember_authority(cmd(), state)
    assert state.highest_term == 3 and state.term_controller_id == "c1"
    assert "below the highest" in verdict(cmd(controller_term=2), state)
    assert "below the highest" in verdict(cmd(controller_term=0), state)  # no legacy namespace
    assert "already belongs" in verdict(cmd(controller_id="c2"), state)
    assert (
        verdict(
            cmd(
                controller_term=4, controller_id="c2", plan_generation="new:00000000000000000001:y"
            ),
            state,
        )
        is None
    )
    # The fence persists through the state file's encoding (node restart).
    restored = msgspec.json.decode(msgspec.json.encode(state), type=NodeState)
    assert "below the highest" in verdict(cmd(controller_term=2), restored)


def test_expired_authority_uses_the_monotonic_deadline():
    sent, ttl = 100.0, 5.0
    deadline = authority_deadline(sent, ttl)
    assert verdict(cmd(), now=104.9, deadline=deadline) is None
    assert "expired" in verdict(cmd(), now=105.0, deadline=deadline)


def test_older_plan_generation_is_rejected_within_one_epoch():
    state = NodeState(host_id="host-a")
    remember_authority(cmd(), state)
    assert "older" in verdict(cmd(plan_generation="ep:00000000000000000004:z"), state)
    assert verdict(cmd(plan_generation="ep:00000000000000000005:z"), state) is None
    assert "malformed" in verdict(cmd(plan_generation="garbage"), state)


def test_dependencies_must_have_succeeded():
    state = NodeState(host_id="host-a")
    assert "dependency l1" in verdict(cmd(dependencies=["l1"]), state)
    state.add_receipt(
        Receipt(ack=Acknowledgement(action_id="l1", status="failed"), kind="load", model_id="m")
    )
    assert "(failed)" in verdict(cmd(dependencies=["l1"]), state)
    state.add_receipt(
        Receipt(ack=Acknowledgement(action_id="l1", status="succeeded"), kind="load", model_id="m")
    )
    assert verdict(cmd(dependencies=["l1"]), state) is None


def test_local_protection_cancels_constructive_work_only():
    for kind in ("load", "warm"):
        assert "local protection" in verdict(cmd(kind=kind), decision=PAUSED)
    serving = NodeState(host_id="host-a", children={"m": _child("ready")})
    for kind in ("drain", "unload"):
        assert verdict(cmd(kind=kind), serving, decision=PAUSED) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["c1", "c2"])), max_size=20))
def test_highest_term_never_decreases_and_one_controller_per_term(seq):
    state = NodeState(host_id="host-a")
    owners: dict[int, str] = {}
    for i, (term, cid) in enumerate(seq):
        c = cmd(
            controller_term=term,
            controller_id=cid,
            plan_generation=f"ep:{i:020d}:x",
            action_id=f"a{i}",
        )
        before = state.highest_term
        if verdict(c, state) is None:
            remember_authority(c, state)
            assert owners.setdefault(term, cid) == cid
        assert state.highest_term >= before


def test_node_refuses_plain_http_off_loopback(tmp_path):
    import pytest

    from grid_core.errors import ValidationError
    from grid_core.nodeconfig import NodeConfig

    for ok in (
        "http://127.0.0.1:22100",
        "http://[::1]:22100",
        "http://localhost:1",
    ):
        NodeConfig(state_dir=tmp_path, grid_url=ok)
    # A remote Grid over HTTPS, with engines advertised over TLS (files are checked at start).
    NodeConfig(
        state_dir=tmp_path,
        grid_url="https://grid.company.internal",
        advertise_host="worker-01.company.internal",
        engine_tls_cert=tmp_path / "worker.pem",
        engine_tls_key=tmp_path / "worker-key.pem",
    )
    for bad in ("http://10.0.0.5:22100", "http://grid.company.internal", "ftp://x", "nohost"):
        with pytest.raises(ValidationError, match="--grid"):
            NodeConfig(state_dir=tmp_path, grid_url=bad)


def _child(state: str, failure: str = "") -> ChildRecord:
    return ChildRecord(
        runtime="llama.cpp",
        model_id="m",
        alias="m",
        pid=4242,
        port=18001,
        state=state,
        failure=failure,
    )


def test_stale_drain_is_refused_when_the_named_residency_is_not_serving():
    # The kind "duplicate drain": a drain decided on an old view of this host (its engine
    # died, failed or restarted since) names a residency that is not there; it must not run.
    drain = cmd(kind="drain")
    absent = verdict(drain)
    assert absent is not None and "no m engine runs on this host" in absent
    failed = verdict(drain, NodeState(host_id="host-a", children={"m": _child("failed", "exit 9")}))
    assert failed is not None and "failed (exit 9)" in failed and "unload it instead" in failed
    starting = verdict(drain, NodeState(host_id="host-a", children={"m": _child("starting")}))
    assert starting is not None and "not serving yet" in starting
    for serving in ("ready", "draining"):
        state = NodeState(host_id="host-a", children={"m": _child(serving)})
        assert verdict(drain, state) is None
    # Unload stays idempotent: its postcondition (no engine) may already hold.
    assert verdict(cmd(kind="unload")) is None
