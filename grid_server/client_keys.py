"""Client API keys for ``/v1``: who may spend the fleet when the server faces the network.

A server bound to loopback keeps ``/v1`` open, as before (only this machine can connect). A
server bound to another address requires a client key by default (``grid up --client-keys
required|open``): every ``/v1`` request must carry ``Authorization: Bearer <key>``, the way
OpenAI-compatible clients already send one.

Keys are random (``gk-`` + 256 bits, URL-safe), shown once when created and stored only as
their SHA-256 in ``$GRID_HOME/client-keys.json`` (0600): for a key with 256 bits of entropy a
plain hash cannot be reversed or guessed, so no slow password hash is needed. A key is checked
by hashing what was presented and looking the digest up. Status and ``/nodes`` show names,
creation times and a short digest id, never a key.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

import msgspec

from grid_core.errors import AuthError, ConflictError, NotFoundError, StateError, ValidationError
from grid_core.system import write_atomic

KEYS_FILE = "client-keys.json"
KEY_PREFIX = "gk-"
KEY_BYTES = 32
"""256 random bits per key: far beyond guessing, so a plain SHA-256 is a safe stored form."""
KEY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
"""Key names: who or what uses the key (a team, an app), shown in status and lists."""
MAX_KEY_LEN = 256
"""Longest Authorization value hashed; longer ones are refused before any work."""
MAX_KEYS = 10_000
"""Keys one server keeps: far beyond an intranet's apps and teams."""
ID_HEX = 12
"""Hex digits of the digest shown as a key's id (identifies it without revealing it)."""


class StoredKey(msgspec.Struct, frozen=True):
    """One client key as stored: its SHA-256, when it was created."""

    sha256: str
    created_at: float


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ClientKeys:
    """The client keys of one server and whether ``/v1`` requires one.

    Args:
        home: the Grid home (``client-keys.json`` lives there).
        required: ``True`` when every ``/v1`` request must carry a valid key.

    Raises:
        StateError: the keys file exists but is unreadable or malformed.
    """

    def __init__(self, home: Path, required: bool = False) -> None:
        self.path = home / KEYS_FILE
        self.required = required
        self._keys = self._load()
        self._by_digest = {k.sha256: name for name, k in self._keys.items()}

    def _load(self) -> dict[str, StoredKey]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            return msgspec.json.decode(raw, type=dict[str, StoredKey])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StateError(
                f"{self.path} is malformed ({exc}); restore it from a backup"
            ) from None

    def _save(self, keys: dict[str, StoredKey]) -> None:
        write_atomic(self.path, msgspec.json.encode(keys))
        self._keys = keys
        self._by_digest = {k.sha256: name for name, k in keys.items()}

    def create(self, name: str, now: float) -> str:
        """Create a key named ``name`` and return it (the only time it exists in clear).

        Raises:
            ValidationError: a malformed name, or the key limit reached.
            ConflictError: a key with that name exists (revoke it first).
            StateError: the keys file could not be written (nothing changed).
        """
        if not re.match(KEY_NAME_PATTERN, name):
            msg = f"client key name {name!r}: letters, digits, . _ @ - (at most 64)"
            raise ValidationError(msg)
        if name in self._keys:
            msg = f"client key '{name}' exists; revoke it first to replace it"
            raise ConflictError(msg)
        if len(self._keys) >= MAX_KEYS:
            raise ValidationError(f"at most {MAX_KEYS} client keys; revoke unused ones")
        key = KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
        self._save({**self._keys, name: StoredKey(_digest(key), now)})
        return key

    def revoke(self, name: str) -> None:
        """Delete the key named ``name``: requests carrying it are refused from now on.

        Raises:
            NotFoundError: no key has that name.
            StateError: the keys file could not be written (nothing changed).
        """
        if name not in self._keys:
            known = ", ".join(sorted(self._keys)) or "none"
            raise NotFoundError(f"no client key named '{name}' (keys: {known})")
        self._save({n: k for n, k in self._keys.items() if n != name})

    def check(self, authorization: str | None) -> str | None:
        """The name of the key ``Authorization: Bearer <key>`` carries.

        Returns ``None`` without looking when keys are not required.

        Raises:
            AuthError: keys are required and the header is missing, malformed or names no
                current key.
        """
        if not self.required:
            return None
        presented = None
        if authorization and authorization[:7].lower() == "bearer ":
            presented = authorization[7:].strip()
        if not presented:
            msg = (
                "this Grid requires a client API key: send 'Authorization: Bearer <key>' "
                "(an operator creates one with 'grid keys create NAME')"
            )
            raise AuthError(msg)
        if len(presented) > MAX_KEY_LEN:
            raise AuthError("client API key is invalid or revoked")
        name = self._by_digest.get(_digest(presented))
        if name is None:
            raise AuthError("client API key is invalid or revoked; ask an operator for a key")
        return name

    def public(self) -> list[dict[str, object]]:
        """Names, creation times and digest ids of the keys (never a key)."""
        return [
            {"name": name, "id": k.sha256[:ID_HEX], "created_at": k.created_at}
            for name, k in sorted(self._keys.items())
        ]
