"""Revoking a host withdraws it from the registry at once: its engines leave the route table,
its records leave the controller's host view, writes under a credential issued before the
revocation are refused (also after a restart, from the revocation file), and a newer
credential re-admits the host with its records."""

from __future__ import annotations

from pathlib import Path

import pytest

from grid_core import routing
from grid_core.errors import AuthError, NotFoundError
from grid_core.hosts import LEASE_TTL_S, build_host_snapshots
from grid_core.wire import (
    AllocatorEnvelope,
    Decoded,
    Heartbeat,
    NodeRegistration,
    Residency,
    control_record_id,
    engine_record_id,
)
from grid_server.auth import Credentials
from grid_server.registry import Registry
from grid_server.router import RouterState

BAD, GOOD = "host-bad", "host-good"
MODEL = "m-shared"
ALONE = "m-only-bad"
T0 = 1000.0
REVOKED_AT = T0 + 5.0
PORTS = {BAD: 22301, GOOD: 22302}


def register_host(reg: Registry, host: str, models: list[str], now: float, **kw: float) -> None:
    """A control record (accepting, every model ready) and one engine route per model."""
    rows = [Residency(model_id=m, memory_mb=100, state="ready") for m in models]
    env = AllocatorEnvelope(state="accepting", residencies=rows)
    ctl = NodeRegistration(host_id=host, allocator=env)
    reg.register(host, control_record_id(host), Decoded(ctl), now, **kw)
    for i, m in enumerate(models):
        url = f"http://127.0.0.1:{PORTS[host] + 100 * i}"
        eng = NodeRegistration(
            role="engine", host_id=host, models=[m], url=url, engine_api_key=f"key-{host}"
        )
        reg.register(host, engine_record_id(host, m), Decoded(eng), now, **kw)


def heartbeat(reg: Registry, host: str, now: float, **kw: float) -> None:
    node = control_record_id(host)
    reg.heartbeat(host, node, Decoded(Heartbeat(node_id=node, host_id=host)), now, **kw)


def ready_hosts(router: RouterState, model: str, now: float) -> set[str]:
    """Hosts the router may send a request for ``model`` to now."""
    cands = router.candidates(router.routes(model), now, 0.0)
    return {c.host_id for c in cands if routing.eligible(c)}


def grid() -> tuple[Registry, RouterState]:
    reg = Registry()
    register_host(reg, BAD, [MODEL, ALONE], T0)
    register_host(reg, GOOD, [MODEL], T0)
    return reg, RouterState(reg)


def test_withdraw_takes_the_host_out_of_routing_and_the_host_view_at_once() -> None:
    reg, router = grid()
    now = T0 + 1.0
    assert ready_hosts(router, MODEL, now) == {BAD, GOOD}
    assert ready_hosts(router, ALONE, now) == {BAD}
    withdrawn = reg.withdraw(BAD, REVOKED_AT)
    assert {r.record_id for r in withdrawn} == {
        control_record_id(BAD),
        engine_record_id(BAD, MODEL),
        engine_record_id(BAD, ALONE),
    }
    # The very next pick, still inside the lease, sees only the other host.
    assert ready_hosts(router, MODEL, now) == {GOOD}
    assert router.routes(ALONE) == []
    assert BAD not in reg.instances
    assert {h.host_id for h in build_host_snapshots(reg.live(now), now, {})} == {GOOD}
    assert {n["host_id"] for n in reg.public(now)} == {GOOD}
    # The key stays for a request already relayed there, until the held record lapses.
    assert reg.engine_key(engine_record_id(BAD, MODEL)) == f"key-{BAD}"


def test_a_write_under_a_credential_from_before_the_revocation_is_refused() -> None:
    # The credential was verified before the revocation; the body arrived after it.
    reg, router = grid()
    reg.withdraw(BAD, REVOKED_AT)
    for issued in (None, T0, REVOKED_AT):
        kw = {} if issued is None else {"issued_at": issued}
        with pytest.raises(AuthError, match="was revoked"):
            heartbeat(reg, BAD, T0 + 2.0, **kw)
        with pytest.raises(AuthError, match="was revoked"):
            register_host(reg, BAD, [MODEL], T0 + 2.0, **kw)
    assert ready_hosts(router, MODEL, T0 + 2.0) == {GOOD}
    assert reg.revocations()[0]["state"] == "withdrawn"


def test_a_newer_credential_re_admits_the_host_with_its_records() -> None:
    reg, router = grid()
    reg.withdraw(BAD, REVOKED_AT)
    heartbeat(reg, BAD, T0 + 10.0, issued_at=REVOKED_AT + 1.0)
    assert ready_hosts(router, MODEL, T0 + 10.0) == {BAD, GOOD}
    assert ready_hosts(router, ALONE, T0 + 10.0) == {BAD}
    (row,) = reg.revocations()
    assert row["host_id"] == BAD and row["state"] == "readmitted"
    # Still revoked for the old credentials.
    with pytest.raises(AuthError):
        heartbeat(reg, BAD, T0 + 11.0, issued_at=T0)


def test_held_records_lapse_like_live_ones() -> None:
    reg, router = grid()
    reg.withdraw(BAD, REVOKED_AT)
    later = T0 + LEASE_TTL_S + 1.0
    reg.expire(later)
    assert reg.engine_key(engine_record_id(BAD, MODEL)) is None
    # Re-admitted after the lapse: nothing comes back; the node registers again.
    with pytest.raises(NotFoundError):
        heartbeat(reg, BAD, later, issued_at=later)
    register_host(reg, BAD, [MODEL], later, issued_at=later)
    assert BAD in ready_hosts(router, MODEL, later)


def test_a_registry_started_with_the_revocation_file_refuses_the_old_credential(
    tmp_path: Path,
) -> None:
    # The server restarts: the registry is empty and built from revoked-hosts.json.
    Credentials(tmp_path).revoke(BAD, REVOKED_AT)
    reg = Registry(revoked=Credentials(tmp_path).revoked)
    router = RouterState(reg)
    with pytest.raises(AuthError, match="was revoked"):
        register_host(reg, BAD, [MODEL], T0 + 20.0, issued_at=T0)
    assert router.routes(MODEL) == []
    (row,) = reg.revocations()
    assert row["host_id"] == BAD and row["state"] == "withdrawn"
    assert row["revoked_at"] == REVOKED_AT
    register_host(reg, BAD, [MODEL], T0 + 21.0, issued_at=REVOKED_AT + 10.0)
    assert ready_hosts(router, MODEL, T0 + 21.0) == {BAD}


def _revoke_answer(creds: Credentials, reg: Registry, host: str, now: float) -> dict:
    """The server's answer to ``POST /allocator/hosts/{host}/revoke`` on a grid ``reg``."""
    from types import SimpleNamespace

    from grid_server.api_allocator import revoke_host

    ctx = SimpleNamespace(
        credentials=creds,
        registry=reg,
        router=RouterState(reg),
        runner=SimpleNamespace(input_changed=lambda *_a, **_k: None),
    )
    return revoke_host(ctx, host, now)  # type: ignore[arg-type]


def test_revoke_lines_tell_a_mistyped_id_from_a_revocation_that_withdrew_something(
    tmp_path: Path,
) -> None:
    # 'node revoke host-2' for host-02 at 2 a.m.: the answer must not read like host-02
    # was revoked; it warns that the server knows no such host.
    from grid_server.cli_allocator import revoke_lines

    reg, _router = grid()
    creds = Credentials(tmp_path)
    typo = revoke_lines(_revoke_answer(creds, reg, "host-bda", REVOKED_AT))
    assert any("warning: this server knows no host 'host-bda'" in line for line in typo), typo
    assert any("the host you meant is still admitted" in line for line in typo), typo
    # The real host: its engines are listed, no warning.
    first = _revoke_answer(creds, reg, BAD, REVOKED_AT)
    assert first["already_revoked_at"] is None
    text = "\n".join(revoke_lines(first))
    assert "withdrew 2 engine(s) of host-bad" in text and "warning: this server" not in text
    # Revoked again: nothing left to withdraw, and the answer says why (not a typo).
    again = _revoke_answer(creds, reg, BAD, REVOKED_AT + 1.0)
    assert again["already_revoked_at"] == REVOKED_AT
    text = "\n".join(revoke_lines(again))
    assert "host-bad was already revoked" in text and "knows no host" not in text, text


def test_revoking_a_host_with_only_a_node_record_does_not_say_nothing_was_withdrawn(
    tmp_path: Path,
) -> None:
    # A node agent with no engine yet: its control record (its capacity) is withdrawn.
    from grid_server.cli_allocator import revoke_lines

    reg = Registry()
    register_host(reg, GOOD, [], T0)
    answer = _revoke_answer(Credentials(tmp_path), reg, GOOD, REVOKED_AT)
    assert answer["control_record"] is True
    text = "\n".join(revoke_lines(answer))
    assert "withdrew host-good's node record" in text, text
    assert "nothing was withdrawn" not in text and "knows no host" not in text, text
