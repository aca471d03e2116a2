"""The engine key a host registers: the newest authenticated registration of a record wins,
so a node whose key was rotated (``grid allocator node rotate-engine-key``) is reached with
the new key from its next registration on, and the old key is never sent again."""

from __future__ import annotations

from grid_core.wire import Decoded, NodeRegistration, control_record_id, engine_record_id
from grid_server.registry import Registry

HOST = "host-rot"
MODEL = "m-rot"
CTL = control_record_id(HOST)
ENG = engine_record_id(HOST, MODEL)
URL = "http://127.0.0.1:22200"
RUN_1 = "1" * 32
RUN_2 = "2" * 32


def register_run(reg: Registry, instance: str, key: str | None, now: float) -> None:
    """One agent run: its control record, then its engine route with ``key``."""
    reg.register(HOST, CTL, Decoded(NodeRegistration(host_id=HOST, instance_id=instance)), now)
    engine = NodeRegistration(
        role="engine",
        host_id=HOST,
        models=[MODEL],
        url=URL,
        engine_api_key=key,
        instance_id=instance,
    )
    reg.register(HOST, ENG, Decoded(engine), now)


def test_a_restarted_node_with_a_rotated_key_replaces_the_stored_one() -> None:
    reg = Registry()
    register_run(reg, RUN_1, "old-key", 1000.0)
    assert reg.engine_key(ENG) == "old-key"
    # node stop withdraws the run's records; the next start registers the new key.
    reg.remove(HOST, ENG, RUN_1, 1010.0)
    reg.remove(HOST, CTL, RUN_1, 1010.0)
    register_run(reg, RUN_2, "new-key", 1020.0)
    assert reg.engine_key(ENG) == "new-key" and reg.engine_key_known(ENG)


def test_re_registering_a_live_route_takes_the_newest_key() -> None:
    # A route still live is re-registered with another key: no first-key-wins.
    reg = Registry()
    register_run(reg, RUN_1, "old-key", 1000.0)
    reg.register(
        HOST,
        ENG,
        Decoded(
            NodeRegistration(
                role="engine",
                host_id=HOST,
                models=[MODEL],
                url=URL,
                engine_api_key="new-key",
                instance_id=RUN_1,
            )
        ),
        1005.0,
    )
    assert reg.engine_key(ENG) == "new-key"
