"""Credentials: the operator capability and expiring host-scoped node credentials.

Source: the specification's "HTTP control surface" and "Remote Grid deployment".

* The operator capability is a random secret in ``operator-token`` (0600) in the server home
  (``$GRID_HOME``, or ``$GRID_HOME/fleet/server`` for a test fleet); a refusal names that
  exact file. It authorizes ``/allocator/*`` mutations, sent as ``X-Grid-Allocator-Token`` or
  ``Authorization: Bearer``.
* A node credential is signed by the server (itsdangerous, HMAC-SHA256 over a JSON payload
  ``{"host_id", "expires_at", "issued_at"}``) with ``$GRID_HOME/signing-key`` (0600). It
  authorizes the ``/nodes`` routes for exactly one host id until it expires, or until the
  host is revoked (``$GRID_HOME/revoked-hosts.json``: a credential issued before the host's
  revocation is refused; one issued afterwards re-admits the host).
* A join token is signed the same way under another salt, carries a random ``join_id``, a
  host id and an expiry, and is exchanged once for a node credential: the spent ids are kept
  in ``$GRID_HOME/join-spent.json`` (until they would have expired anyway), so a replay is
  refused even after a server restart.

No secret is ever logged, echoed in status or placed in a URL or argv.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

import msgspec
from itsdangerous import BadSignature, URLSafeSerializer

from grid_core.bodies import NODE_CREDENTIAL_TTL_S
from grid_core.errors import AuthError, ForbiddenError, StateError
from grid_core.system import write_atomic
from grid_server.home import OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE, read_or_create_secret

NODE_SALT = "grid-node-credential-v1"
"""Domain separation: a node credential can never be replayed as another signed object."""
JOIN_SALT = "grid-join-token-v1"
"""Domain separation: a join token is not a node credential, and neither is the other."""
REVOKED_FILE = "revoked-hosts.json"
JOIN_SPENT_FILE = "join-spent.json"
MAX_SPENT_JOINS = 10_000
"""Spent join ids kept (each only until its token would have expired): far above any
provisioning rate, small enough to rewrite the file on every join."""
HOST_ID_PREFIX = "host-"
MAX_TOKEN_LEN = 1024
"""Longest credential accepted in a header; longer values are refused before verification."""


class NodeClaims(msgspec.Struct, frozen=True):
    """What a node credential proves: the host id, when the proof ends and when it was
    issued (Unix seconds; 0 for credentials from before revocation existed)."""

    host_id: str
    expires_at: float
    issued_at: float = 0.0


class JoinClaims(msgspec.Struct, frozen=True):
    """What a join token proves: a one-time id, the host it provisions, its expiry."""

    join_id: str
    host_id: str
    expires_at: float


class Revocation(msgspec.Struct, frozen=True):
    """A revoked host: credentials issued at or before ``revoked_at`` are refused."""

    host_id: str
    revoked_at: float


def new_host_id() -> str:
    """A fresh stable host id for provisioning (``host-`` + 16 hex digits)."""
    return HOST_ID_PREFIX + secrets.token_hex(8)


class Credentials:
    """Loads (or creates) the operator capability and signing key from the Grid home."""

    def __init__(self, home: Path) -> None:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.operator_token_path = home / OPERATOR_TOKEN_FILE
        self._operator = read_or_create_secret(self.operator_token_path)
        key = read_or_create_secret(home / SIGNING_KEY_FILE)
        self._serializer = URLSafeSerializer(key, salt=NODE_SALT)
        self._join = URLSafeSerializer(key, salt=JOIN_SALT)
        self.revoked_path = home / REVOKED_FILE
        self.spent_path = home / JOIN_SPENT_FILE
        self.revoked: dict[str, float] = _load_floats(self.revoked_path)
        self._spent: dict[str, float] = _load_floats(self.spent_path)

    def check_operator(self, presented: str | None) -> None:
        """Accept only the exact operator capability (constant-time comparison).

        Raises:
            AuthError: missing or wrong capability.
        """
        if not presented:
            msg = (
                "operator capability required: send X-Grid-Allocator-Token or "
                f"Authorization: Bearer (the token is in {self.operator_token_path})"
            )
            raise AuthError(msg)
        if not hmac.compare_digest(presented.encode(), self._operator.encode()):
            msg = f"operator capability is wrong; use the token in {self.operator_token_path}"
            raise AuthError(msg)

    def issue_node(self, host_id: str, now: float, ttl_s: float = NODE_CREDENTIAL_TTL_S) -> str:
        """Sign a credential for ``host_id`` valid for ``ttl_s`` seconds from ``now``."""
        return self._serializer.dumps(
            {"host_id": host_id, "expires_at": now + ttl_s, "issued_at": now}
        )

    def revoke(self, host_id: str, now: float) -> Revocation:
        """Revoke every credential of ``host_id`` issued up to ``now`` (durable).

        The host's next authenticated request (its next heartbeat) is refused; no other host
        is touched. Issuing a new credential or join token afterwards re-admits the host.
        Withdrawing the host from routing and planning is the registry's part
        (:meth:`grid_server.registry.Registry.withdraw`, called with the returned time).

        Raises:
            StateError: the revocation could not be written (nothing changed).
        """
        updated = {**self.revoked, host_id: now}
        _save_floats(self.revoked_path, updated)
        self.revoked = updated
        return Revocation(host_id, now)

    def issue_join(self, host_id: str, now: float, ttl_s: float) -> str:
        """Sign a one-time join token for ``host_id`` valid for ``ttl_s`` seconds."""
        claims = {"join_id": secrets.token_hex(16), "host_id": host_id, "expires_at": now + ttl_s}
        return self._join.dumps(claims)

    def redeem_join(self, presented: str | None, now: float) -> JoinClaims:
        """Verify a join token and spend it: the same token is refused from then on.

        Raises:
            AuthError: missing, malformed, forged, expired or already used.
            StateError: the spent list could not be written (the token stays unspent).
        """
        if not presented or len(presented) > MAX_TOKEN_LEN:
            msg = (
                "join token required in X-Grid-Join-Token; write one with "
                "'grid allocator join write'"
            )
            raise AuthError(msg)
        try:
            claims = msgspec.convert(self._join.loads(presented), JoinClaims)
        except (BadSignature, msgspec.ValidationError):
            msg = (
                "join token is invalid (not signed by this Grid); write a new one with "
                "'grid allocator join write'"
            )
            raise AuthError(msg) from None
        if now >= claims.expires_at:
            msg = (
                f"join token for host '{claims.host_id}' expired; write a new one with "
                "'grid allocator join write'"
            )
            raise AuthError(msg)
        if claims.join_id in self._spent:
            msg = (
                f"join token for host '{claims.host_id}' was already used (a join token works "
                "once); write a new one with 'grid allocator join write'"
            )
            raise AuthError(msg)
        live = {j: exp for j, exp in self._spent.items() if exp > now}
        live[claims.join_id] = claims.expires_at
        if len(live) > MAX_SPENT_JOINS:
            oldest = sorted(live, key=live.__getitem__)[: len(live) - MAX_SPENT_JOINS]
            for j in oldest:
                del live[j]
        _save_floats(self.spent_path, live)
        self._spent = live
        return claims

    def verify_node(self, presented: str | None, now: float) -> NodeClaims:
        """Verify a node credential and return its claims.

        Raises:
            AuthError: missing, malformed, forged or expired credential.
        """
        if not presented:
            msg = "node credential required in X-Grid-Allocator-Node-Token"
            raise AuthError(msg)
        if len(presented) > MAX_TOKEN_LEN:
            msg = "node credential is too long; use the one 'grid allocator token write' wrote"
            raise AuthError(msg)
        try:
            claims = msgspec.convert(self._serializer.loads(presented), NodeClaims)
        except (BadSignature, msgspec.ValidationError):
            msg = "node credential is invalid; write a new one with 'grid allocator token write'"
            raise AuthError(msg) from None
        if now >= claims.expires_at:
            msg = (
                f"node credential for host '{claims.host_id}' expired; write a new one with "
                "'grid allocator token write'"
            )
            raise AuthError(msg)
        revoked_at = self.revoked.get(claims.host_id)
        if revoked_at is not None and claims.issued_at <= revoked_at:
            msg = (
                f"node credential for host '{claims.host_id}' was revoked; provision the host "
                "again with 'grid allocator join write' or 'grid allocator token write'"
            )
            raise AuthError(msg)
        return claims

    @staticmethod
    def require_host(claims: NodeClaims, host_id: str) -> None:
        """Refuse a credential used for another host.

        Raises:
            ForbiddenError: the credential belongs to a different host id.
        """
        if claims.host_id != host_id:
            msg = (
                f"node credential is scoped to host '{claims.host_id}', not '{host_id}'; "
                "use that host's own credential"
            )
            raise ForbiddenError(msg)


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if present."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return None


def _load_floats(path: Path) -> dict[str, float]:
    """A ``{name: Unix seconds}`` JSON file (empty when missing).

    Raises:
        StateError: the file exists but is unreadable or malformed.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return msgspec.json.decode(raw, type=dict[str, float])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StateError(f"{path} is malformed ({exc}); restore it from a backup") from None


def _save_floats(path: Path, doc: dict[str, float]) -> None:
    write_atomic(path, msgspec.json.encode(doc))
