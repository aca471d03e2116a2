"""The etcd state store against a real etcd: conditional writes, lease, term, takeover."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from etcd_process import EtcdServer

from grid_core.errors import ConflictError, UnavailableError, ValidationError
from grid_core.store import StateConflictError, state_digest
from grid_core.system.state_etcd import FAILOVER_DETECTION_S, EtcdSettings, EtcdStateStore

StoreFactory = Callable[..., EtcdStateStore]


@pytest.fixture
def store_on() -> Iterator[StoreFactory]:
    """Stores on a server (each one's connections closed at teardown)."""
    made: list[EtcdStateStore] = []

    def make(server: EtcdServer | str, url: str = "", timeout_s: float = 2.0) -> EtcdStateStore:
        where = server if isinstance(server, str) else server.state_store
        store = EtcdStateStore(EtcdSettings.parse(where), advertise_url=url, timeout_s=timeout_s)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def test_a_write_needs_the_lease_and_the_state_last_seen(
    etcd_server: EtcdServer, store_on: StoreFactory
) -> None:
    a = store_on(etcd_server)
    assert a.load() is None
    with pytest.raises(StateConflictError, match="does not hold the controller lease"):
        a.save(b"doc-1", None)  # no lease: a follower never writes
    term, expires = a.acquire_lease("ctl-a", 100.0, 10)
    # etcd's lease is granted a detection margin shorter, and the holder counts by it.
    assert term == 1 and expires == 100.0 + 10 - FAILOVER_DETECTION_S
    a.save(b"doc-1", None)
    assert a.load() == b"doc-1"
    with pytest.raises(StateConflictError):
        a.save(b"doc-2", None)  # stale view: the state is doc-1 now
    assert a.load() == b"doc-1"
    a.save(b"doc-2", state_digest(b"doc-1"))
    assert a.load() == b"doc-2"


def test_second_server_follows_then_takes_over_with_a_higher_term(
    etcd_server: EtcdServer, store_on: StoreFactory
) -> None:
    a, b = store_on(etcd_server, "http://a"), store_on(etcd_server, "http://b")
    assert a.acquire_lease("ctl-a", 0.0, 3)[0] == 1
    a.save(b"from-a", None)
    with pytest.raises(ConflictError, match=r"ctl-a.*term 1.*http://a"):
        b.acquire_lease("ctl-b", 0.0, 3)
    holder = b.leader()
    assert holder is not None and holder.holder == "ctl-a" and holder.url == "http://a"
    # Renewal keeps the same term.
    assert a.acquire_lease("ctl-a", 1.0, 3)[0] == 1
    # ctl-a stops renewing (killed): etcd expires its lease and ctl-b takes term 2.
    start = time.monotonic()
    while True:
        try:
            term, _ = b.acquire_lease("ctl-b", 0.0, 3)
            break
        except ConflictError:
            assert time.monotonic() - start < 30, "the lapsed lease was never released"
            time.sleep(0.2)
    assert term == 2
    # The old leader can neither write nor renew: its authority is gone for good.
    with pytest.raises(StateConflictError):
        a.save(b"stale", state_digest(b"from-a"))
    with pytest.raises(ConflictError):
        a.acquire_lease("ctl-a", 9.0, 3)
    assert b.load() == b"from-a"
    b.save(b"from-b", state_digest(b"from-a"))
    assert a.load() == b"from-b"


def test_clean_release_hands_over_at_once_and_terms_never_repeat(
    etcd_server: EtcdServer, store_on: StoreFactory
) -> None:
    a, b = store_on(etcd_server), store_on(etcd_server)
    terms = []
    for _ in range(3):
        terms.append(a.acquire_lease("ctl-a", 0.0, 30)[0])
        a.release_lease("ctl-a")
        terms.append(b.acquire_lease("ctl-b", 0.0, 30)[0])
        b.release_lease("ctl-b")
    assert terms == sorted(set(terms)) and len(terms) == 6


def test_term_can_be_seeded_above_another_stores(
    etcd_server: EtcdServer, store_on: StoreFactory
) -> None:
    a = store_on(etcd_server)
    a.seed_term(41)
    assert a.acquire_lease("ctl-a", 0.0, 10)[0] == 42
    a.seed_term(5)  # never lowers
    a.release_lease("ctl-a")
    assert a.acquire_lease("ctl-a", 0.0, 10)[0] == 43


def test_quarantine_moves_the_document_aside(
    etcd_server: EtcdServer, store_on: StoreFactory
) -> None:
    a = store_on(etcd_server)
    a.acquire_lease("ctl-a", 0.0, 10)
    a.save(b"{not json", None)
    where = a.quarantine("corrupt")
    assert a.load() is None and "corrupt-" in where


def test_unreachable_etcd_is_unavailable_naming_the_endpoints(store_on: StoreFactory) -> None:
    dead = store_on("etcd://127.0.0.1:9,127.0.0.1:10", timeout_s=0.5)
    where = r"etcd unreachable.*127\.0\.0\.1:9.*127\.0\.0\.1:10"
    with pytest.raises(UnavailableError, match=where):
        dead.load()


def test_second_endpoint_is_used_when_the_first_is_down(
    etcd_server: EtcdServer, store_on: StoreFactory
) -> None:
    host = etcd_server.url.split("://", 1)[1]
    s = store_on(f"etcd://127.0.0.1:9,{host}", timeout_s=0.5)
    assert s.load() is None
    assert s.acquire_lease("ctl", 0.0, 10)[0] == 1


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("http://127.0.0.1:2379", "expected etcd://"),
        ("etcd://", "is not host:port"),
        ("etcd://host", "is not host:port"),
        ("etcd://h:2379,h:99999", "'h:99999' is not host:port"),
    ],
)
def test_bad_store_urls_name_the_part_and_the_form(url: str, fix: str) -> None:
    with pytest.raises(ValidationError, match=fix):
        EtcdSettings.parse(url)


def test_url_prefix_and_tls_scheme() -> None:
    s = EtcdSettings.parse("etcds://a:1,b:2/fleet-x")
    assert s.endpoints == ("https://a:1", "https://b:2") and s.prefix == "/fleet-x/"
