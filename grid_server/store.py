"""The controller's state stores, as the server uses them (file by default, or etcd).

The implementation lives in the host-OS toolkit (:mod:`grid_core.system.state_file`) so tools
that embed a controller reach it through the public plugin API without importing the server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grid_core.store import StoreIdentity, state_digest
from grid_core.system.state_etcd import EtcdStateStore, settings_from_options
from grid_core.system.state_file import LOCK_TIMEOUT_S, FileStateStore, LeaseRecord

__all__ = [
    "LOCK_TIMEOUT_S",
    "EtcdStateStore",
    "FileStateStore",
    "LeaseRecord",
    "copy_state",
    "file_store",
    "open_state_store",
    "store_identity",
]


def open_state_store(
    url: str,
    *,
    advertise_url: str = "",
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    username: str | None = None,
    password_file: str | None = None,
) -> EtcdStateStore:
    """The replicated store ``grid up --state-store`` names (etcd; the file store is the
    default and needs no URL).

    Args:
        url: ``etcd://host:port[,host:port…][/prefix]`` or ``etcds://…`` for TLS.
        advertise_url: this server's URL, recorded with the lease so followers name the leader.
        ca_file / cert_file / key_file: etcd TLS (server CA; client certificate and key).
        username / password_file: etcd role-based access control.

    Raises:
        ValidationError: a malformed URL or option (the message names the flag and the form).
    """
    settings = settings_from_options(
        url,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
        username=username,
        password_file=password_file,
    )
    return EtcdStateStore(settings, advertise_url=advertise_url)


MOVER_ID = "grid-state-copy"
"""Controller id the copy command takes the lease under while it writes (never a server's)."""
MOVE_LEASE_S = 30.0
"""The copy command's lease: far longer than one copy takes; it releases it at once after."""


def file_store(home: Path, state_dir: Path | None = None) -> FileStateStore:
    """The file store a server on this ``GRID_HOME`` (or ``--state-dir``) uses."""
    from grid_server.app import STATE_FILE
    from grid_server.home import STATE_DIR

    return FileStateStore((state_dir or home / STATE_DIR) / STATE_FILE)


def store_identity(store: FileStateStore | EtcdStateStore) -> StoreIdentity:
    """The identity of ``store`` (the file store: its state file resolved to an absolute path;
    etcd: its endpoints and key prefix), as ``server.json`` records it."""
    if isinstance(store, FileStateStore):
        return StoreIdentity(kind="file", path=str(store.path.expanduser().resolve()))
    return StoreIdentity(
        kind="etcd", endpoints=tuple(store.settings.endpoints), prefix=store.settings.prefix
    )


def copy_state(source: Any, target: Any, *, now: float, force: bool = False) -> tuple[int, int]:
    """Copy the controller document from one store to another, keeping terms monotonic.

    Every server on both stores must be stopped: the copy takes each store's lease (so a
    controller in automatic mode, which holds it, makes it fail instead of racing it; one in
    observe or recommend mode holds none, which is why ``grid allocator state copy`` also
    refuses while this Grid home's server runs on either store) and releases it afterwards. The
    target's term counter is raised to the source's, so the next leader's term is above every
    term a node has seen.

    Args:
        source / target: :class:`FileStateStore` or :class:`EtcdStateStore`.
        now: wall-clock seconds.
        force: replace a document the target already holds.

    Returns:
        ``(bytes copied, term the target continues from)``.

    Raises:
        ConflictError: a controller holds either lease (stop the servers first), or the target
            already has a document and ``force`` is off.
        StateError: the source has no document, or a store failed.
    """
    from grid_core.errors import ConflictError, StateError

    src_term, _ = source.acquire_lease(MOVER_ID, now, MOVE_LEASE_S)
    try:
        data = source.load()
        if data is None:
            msg = "the source store holds no controller state; nothing to copy"
            raise StateError(msg)
        dst_term, _ = target.acquire_lease(MOVER_ID, now, MOVE_LEASE_S)
        try:
            current = target.load()
            if current is not None and current != data and not force:
                msg = (
                    "the target store already holds controller state; pass --force to "
                    "replace it (it is overwritten, not merged)"
                )
                raise ConflictError(msg)
            if current != data:
                target.save(data, state_digest(current))
            term = max(src_term, dst_term)
            target.seed_term(term)
            return len(data), term
        finally:
            target.release_lease(MOVER_ID)
    finally:
        source.release_lease(MOVER_ID)
