"""Durable node state: one owner-only JSON file, replaced atomically on every change.

The file holds the stable host id, protection state and local override, engine children with
their identity proofs, cached artifacts, the latest plan generation, the highest controller
term (and the one controller id accepted in it), bounded action receipts, the per-host engine
API key and the server's last-used watermarks (specification, "Managed host actuator").

Writes go to a temp file created 0600 in the same directory, are fsynced, renamed over the
old file and the directory is fsynced, so a crash leaves the old or the new state, never a mix.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

import filelock
import msgspec

from grid_core.errors import ConflictError, NotFoundError, StateError
from grid_core.protection import Override, ProtectionState
from grid_core.runtime import ChildRecord, LoadResult
from grid_core.system import write_atomic
from grid_core.wire import Acknowledgement

STATE_FILE = "node.json"
LOCK_FILE = "node.lock"
KEY_FILE = "engine-api-key"
MAX_RECEIPTS = 200
"""Receipts kept for idempotent redelivery and status: far more than one host's in-flight
work, small enough that the file stays a few hundred KB."""
ENGINE_KEY_BYTES = 32
"""256-bit engine key: unguessable from the LAN."""


class Receipt(msgspec.Struct, kw_only=True):
    """The outcome of one command, kept until acknowledged and then for idempotency.

    Attributes:
        ack: the acknowledgement sent (or to send).
        kind / model_id: what the command did.
        delivered: whether a heartbeat carried the acknowledgement successfully.
    """

    ack: Acknowledgement
    kind: str
    model_id: str
    delivered: bool = False


class PredictiveDownload(msgspec.Struct, kw_only=True):
    """One predictive download: the exact SHA-256 and when it finished (Unix seconds)."""

    sha256: str
    at: float


class NodeState(msgspec.Struct, kw_only=True):
    """Everything a node must remember across restarts."""

    host_id: str
    engine_api_key: str = ""
    protection: ProtectionState = msgspec.field(default_factory=ProtectionState)
    override: Override | None = None
    children: dict[str, ChildRecord] = {}
    artifacts: dict[str, LoadResult] = {}
    artifact_runtimes: dict[str, str] = {}
    """The runtime whose adapter verified each artifact (older state files: llama.cpp)."""
    latest_generation: str | None = None
    highest_term: int = 0
    term_controller_id: str = ""
    receipts: list[Receipt] = []
    running_action: str | None = None
    """The action that was executing when the state was last written (restart marks it failed)."""
    running_kind: str = ""
    running_model: str = ""
    model_last_used_at: dict[str, float] = {}
    predictive: dict[str, PredictiveDownload] = {}
    """Provenance of artifacts this node downloaded for a cache-only predictive prefetch and
    has not started since (model id → record); a warm or an eviction removes the record."""

    def receipt(self, action_id: str) -> Receipt | None:
        """The receipt of ``action_id`` if one is kept."""
        return next((r for r in self.receipts if r.ack.action_id == action_id), None)

    def add_receipt(self, receipt: Receipt) -> None:
        """Append a receipt, dropping the oldest delivered ones past :data:`MAX_RECEIPTS`."""
        self.receipts = [r for r in self.receipts if r.ack.action_id != receipt.ack.action_id]
        self.receipts.append(receipt)
        while len(self.receipts) > MAX_RECEIPTS:
            drop = next((i for i, r in enumerate(self.receipts) if r.delivered), 0)
            self.receipts.pop(drop)


def keyed_children(state: NodeState) -> list[str]:
    """Model ids of the engine children a restart would adopt and route to again.

    Such a child was launched with the engine key of its time and keeps that key until it
    exits, so the key must not change while one is recorded. A fenced child (its identity was
    not provable after a restart) is left alone and never routed again, so it does not count.

    Returns:
        The model ids, in the state's order (empty when the key may change).
    """
    return [model_id for model_id, child in state.children.items() if not child.fenced]


def new_host_id() -> str:
    """A fresh stable host id (random; the machine keeps it in its state file)."""
    return f"host-{secrets.token_hex(8)}"


class StateFile:
    """Owner-only durable state in ``state_dir`` with a single-writer lock.

    Args:
        state_dir: directory (created 0700).
    """

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.key_path = self.dir / KEY_FILE
        self._lock: filelock.FileLock | None = None

    def ensure_dir(self) -> None:
        """Create the directory owner-only; refuse one that others can read or write."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        mode = stat.S_IMODE(self.dir.stat().st_mode)
        if mode & 0o077:
            os.chmod(self.dir, 0o700)

    def lock(self) -> None:
        """Take the exclusive instance lock (one agent per state directory).

        Raises:
            ConflictError: another node agent holds this state directory.
        """
        self.ensure_dir()
        lock = filelock.FileLock(self.dir / LOCK_FILE, mode=0o600)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            msg = (
                f"another node agent is using {self.dir}; stop it first "
                "(grid allocator node stop) or use a different --state-dir"
            )
            raise ConflictError(msg) from None
        self._lock = lock

    def unlock(self) -> None:
        """Release the instance lock."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def load(self) -> NodeState | None:
        """The saved state, or ``None`` when there is none.

        Raises:
            StateError: the file exists but is unreadable or corrupt.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            msg = f"cannot read node state {self.path}: {exc}"
            raise StateError(msg) from exc
        try:
            return msgspec.json.decode(data, type=NodeState)
        except msgspec.DecodeError as exc:
            msg = (
                f"node state {self.path} is corrupt ({exc}); move it aside to start fresh "
                "(children it recorded must then be inspected by hand)"
            )
            raise StateError(msg) from exc

    def save(self, state: NodeState) -> None:
        """Replace the state atomically (0600 temp file, fsync, rename, directory fsync).

        Raises:
            StateError: the write failed; the previous file is untouched.
        """
        self.ensure_dir()
        write_atomic(self.path, msgspec.json.encode(state))

    def write_key_file(self, key: str) -> Path:
        """Write llama.cpp's one-key-per-line file owner-only; returns its path.

        Raises:
            StateError: the file could not be written.
        """
        self.ensure_dir()
        write_atomic(self.key_path, key + "\n")
        return self.key_path

    def load_or_create(self, host_id: str | None = None) -> NodeState:
        """Load the state or create a fresh one (new engine key; ``host_id`` or a new id).

        Raises:
            ConflictError: ``host_id`` differs from the one already stored.
        """
        state = self.load()
        if state is None:
            state = NodeState(
                host_id=host_id or new_host_id(),
                engine_api_key=secrets.token_urlsafe(ENGINE_KEY_BYTES),
            )
            self.save(state)
        elif host_id and state.host_id != host_id:
            msg = (
                f"state in {self.dir} belongs to host {state.host_id}, not {host_id}; "
                "use another --state-dir or omit --host-id"
            )
            raise ConflictError(msg)
        if not state.engine_api_key:
            state.engine_api_key = secrets.token_urlsafe(ENGINE_KEY_BYTES)
            self.save(state)
        self.write_key_file(state.engine_api_key)
        return state

    def rotate_engine_key(self) -> NodeState:
        """Replace the engine key with a fresh one while no node agent runs here.

        The instance lock is held for the whole change, so an agent cannot start halfway. The
        state is saved first (atomically, owner-only) and is the key's source; llama.cpp's
        key file is then rewritten from it (every agent start rewrites that file from the
        state too). No message carries the key.

        Returns:
            The saved state, holding the new key (:data:`ENGINE_KEY_BYTES` random bytes).

        Raises:
            NotFoundError: the directory holds no node state; nothing is created.
            ConflictError: a node agent holds the directory, or the state records engine
                children started with the current key (see :func:`keyed_children`);
                nothing is written.
            StateError: the state is unreadable or corrupt, or a write failed (the state
                keeps its previous key when its own write failed).
        """
        missing = (
            f"no node state in {self.dir}; there is no engine key to rotate (give the "
            "--state-dir the node was started with)"
        )
        # Checked before the lock as well, so a refusal leaves no lock file behind either.
        self._rotatable(self.load(), missing)
        try:
            self.lock()
        except ConflictError:
            msg = (
                f"a node agent is running for {self.dir}; stop it first with 'grid "
                f"allocator node stop --state-dir {self.dir}', rotate, then start it again"
            )
            raise ConflictError(msg) from None
        try:
            state = self._rotatable(self.load(), missing)
            state.engine_api_key = secrets.token_urlsafe(ENGINE_KEY_BYTES)
            self.save(state)
            self.write_key_file(state.engine_api_key)
        finally:
            self.unlock()
        return state

    def _rotatable(self, state: NodeState | None, missing: str) -> NodeState:
        """``state`` when its engine key may be replaced (see :meth:`rotate_engine_key`).

        Raises:
            NotFoundError: there is no state (``missing`` is the message).
            ConflictError: the state records engines started with the current key.
        """
        if state is None:
            raise NotFoundError(missing)
        running = keyed_children(state)
        if running:
            msg = (
                f"the node state in {self.dir} still records engines started with the "
                f"current key ({', '.join(running)}); run 'grid allocator node stop "
                f"--state-dir {self.dir}' first (it stops them, or forgets ones that are "
                "gone), then rotate"
            )
            raise ConflictError(msg)
        return state
