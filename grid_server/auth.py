"""Credentials: the operator capability and expiring host-scoped node credentials.

Source: the specification's "HTTP control surface" and "Remote Grid deployment".

* The operator capability is a random secret in ``operator-token`` (0600) in the server home
  (``$GRID_HOME``, or ``$GRID_HOME/fleet/server`` for a test fleet); a refusal names that
  exact file. It authorizes ``/allocator/*`` mutations, sent as ``X-Grid-Allocator-Token`` or
  ``Authorization: Bearer``.
* A node credential is signed by the server (itsdangerous, HMAC-SHA256 over a JSON payload
  ``{"host_id", "expires_at"}``) with ``$GRID_HOME/signing-key`` (0600). It authorizes the
  ``/nodes`` routes for exactly one host id until it expires.

Neither secret is ever logged, echoed in status or placed in a URL or argv.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

import msgspec
from itsdangerous import BadSignature, URLSafeSerializer

from grid_core.bodies import NODE_CREDENTIAL_TTL_S
from grid_core.errors import AuthError, ForbiddenError
from grid_server.home import OPERATOR_TOKEN_FILE, SIGNING_KEY_FILE, read_or_create_secret

NODE_SALT = "grid-node-credential-v1"
"""Domain separation: a node credential can never be replayed as another signed object."""
HOST_ID_PREFIX = "host-"
MAX_TOKEN_LEN = 1024
"""Longest credential accepted in a header; longer values are refused before verification."""


class NodeClaims(msgspec.Struct, frozen=True):
    """What a node credential proves: the host id and when the proof ends (Unix seconds)."""

    host_id: str
    expires_at: float


def new_host_id() -> str:
    """A fresh stable host id for provisioning (``host-`` + 16 hex digits)."""
    return HOST_ID_PREFIX + secrets.token_hex(8)


class Credentials:
    """Loads (or creates) the operator capability and signing key from the Grid home."""

    def __init__(self, home: Path) -> None:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.operator_token_path = home / OPERATOR_TOKEN_FILE
        self._operator = read_or_create_secret(self.operator_token_path)
        self._serializer = URLSafeSerializer(
            read_or_create_secret(home / SIGNING_KEY_FILE), salt=NODE_SALT
        )

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
        return self._serializer.dumps({"host_id": host_id, "expires_at": now + ttl_s})

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
