"""Request and answer bodies of the operator and node control routes (msgspec Structs).

The server declares these as the typed ``data`` of its Litestar handlers, so the framework
decodes and validates them (a refusal names the field path, e.g. ``$.ttl_s``); the client
(:mod:`grid_core.client`) encodes the same types. Source: the specification's "HTTP control
surface".

Operator bodies forbid unknown fields: an operator's typo must be refused, never dropped.
The node wire documents (:mod:`grid_core.wire`) stay additive on purpose, because a newer node
may talk to an older server during a rolling upgrade.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from grid_core.demand.features import RequestFeatures
from grid_core.wire import IDENT_PATTERN, MAX_LIST, Id, Mode, ModelId, Text

NODE_CREDENTIAL_TTL_S = 30 * 24 * 3600.0
"""Default lifetime of a node credential: a month, so provisioning is rare but leaks expire."""
MAX_NODE_CREDENTIAL_TTL_S = 366 * 24 * 3600.0
"""Longest lifetime an operator may request: a year."""
HOST_ID_PATTERN = IDENT_PATTERN
"""Host ids follow the one identifier grammar (:data:`grid_core.wire.IDENT_PATTERN`): they
appear in record ids, status lines and file names."""
WORKLOAD_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
"""Workload names: short lowercase identifiers (the profile's vocabulary uses the same rule)."""
MAX_LATENCY_MS = 24 * 3600 * 1000.0
"""A measured latency above a day is a broken clock, not evidence."""

JOIN_TOKEN_TTL_S = 3600.0
"""Default lifetime of a join token: an hour, time to copy one file and run one command."""
MAX_JOIN_TOKEN_TTL_S = 7 * 24 * 3600.0
"""Longest join token: a week (it is a bearer secret until it is used)."""
JOIN_HEADER = "X-Grid-Join-Token"
"""Header carrying a join token to ``POST /allocator/join``."""

HostId = Annotated[str, msgspec.Meta(pattern=HOST_ID_PATTERN)]
CredentialTtl = Annotated[float, msgspec.Meta(gt=0.0, le=MAX_NODE_CREDENTIAL_TTL_S)]


class OperatorBody(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Base of operator request bodies: unknown fields are refused by name."""


class TokenBody(OperatorBody, frozen=True):
    """``POST /allocator/tokens``: which host the credential is for and how long it lasts.

    Attributes:
        host_id: the host to authorize; ``None`` lets the server generate a fresh id.
        ttl_s: lifetime in seconds, in (0, :data:`MAX_NODE_CREDENTIAL_TTL_S`].
    """

    host_id: HostId | None = None
    ttl_s: CredentialTtl = NODE_CREDENTIAL_TTL_S


class JoinTokenBody(OperatorBody, frozen=True):
    """``POST /allocator/join-tokens``: which host the join token provisions, how long it lasts.

    Attributes:
        host_id: the host to provision; ``None`` lets the server generate a fresh id.
        ttl_s: lifetime in seconds, in (0, :data:`MAX_JOIN_TOKEN_TTL_S`].
    """

    host_id: HostId | None = None
    ttl_s: Annotated[float, msgspec.Meta(gt=0.0, le=MAX_JOIN_TOKEN_TTL_S)] = JOIN_TOKEN_TTL_S


class JoinTokenIssued(msgspec.Struct, frozen=True):
    """Answer of ``POST /allocator/join-tokens``.

    Attributes:
        host_id: the host the token provisions.
        join_token: the one-time secret (never log it).
        expires_at: Unix seconds after which it is refused.
        ca_sha256: SHA-256 of the server's CA certificate (``grid up --tls-ca``), or ``None``.
    """

    host_id: str
    join_token: str
    expires_at: float
    ca_sha256: str | None = None


class JoinFile(msgspec.Struct, frozen=True, kw_only=True):
    """What ``grid allocator join write`` stores (0600): all a new machine needs to join.

    Attributes:
        grid_url: the server's URL as the new machine reaches it.
        ca_sha256: the CA fingerprint the machine pins (``None``: a loopback HTTP grid).
        host_id: the host id it will be.
        join_token: the one-time secret.
        expires_at: Unix seconds after which the server refuses it.
    """

    grid_url: str
    ca_sha256: str | None
    host_id: str
    join_token: str
    expires_at: float


class ClientKeyBody(OperatorBody, frozen=True):
    """``POST /allocator/client-keys``: the name of a new client API key (who uses it)."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class ClientKeyIssued(msgspec.Struct, frozen=True):
    """Answer of ``POST /allocator/client-keys``: the key, shown this once.

    Attributes:
        name: the key's name.
        key: the secret (``gk-…``; never log it).
        id: a short digest id that status and lists show instead of the key.
        created_at: Unix seconds.
    """

    name: str
    key: str
    id: str
    created_at: float


class ModeBody(OperatorBody, frozen=True):
    """``PUT /allocator/mode``: observe, recommend or automatic."""

    mode: Mode


MAX_FORWARDED_OBSERVATIONS = 512
"""Request observations one forwarding call may carry: a follower forwards every two seconds,
so 512 covers 256 requests/s through one follower per call; a larger backlog takes more calls."""


class ObservationBatch(OperatorBody, frozen=True, kw_only=True):
    """``POST /allocator/observations``: requests a follower server answered, forwarded to the
    leader so that they count as demand (the leader's controller is the only one that plans).

    Attributes:
        from_server: the forwarding server's id (for status and logs).
        features: bounded request features, never prompts or raw affinity keys.
    """

    from_server: Annotated[str, msgspec.Meta(max_length=64)]
    features: Annotated[list[RequestFeatures], msgspec.Meta(max_length=MAX_FORWARDED_OBSERVATIONS)]


class EvaluationBody(OperatorBody, frozen=True, kw_only=True):
    """``POST /allocator/evaluations``: labelled quality evidence for one artifact revision.

    Attributes:
        model_id: a model with a profile.
        workload: workload name (lowercase identifier).
        score: quality in [0, 1].
        artifact_sha256: the revision scored (64 hex digits, any case); ``None`` means the
            profile's current digest.
        latency_ms: observed latency of the evaluation run (milliseconds), if measured.
    """

    model_id: ModelId
    workload: Annotated[str, msgspec.Meta(pattern=WORKLOAD_PATTERN)]
    score: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
    artifact_sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-fA-F]{64}$")] | None = None
    latency_ms: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_LATENCY_MS)] | None = None


class NodeCredential(msgspec.Struct, frozen=True):
    """Answer of ``POST /allocator/tokens`` (also the JSON ``token write`` stores, 0600).

    Attributes:
        host_id: the host the credential is scoped to.
        token: the signed credential (a secret: never log it).
        expires_at: Unix seconds after which the server refuses it.
    """

    host_id: str
    token: str
    expires_at: float


class Registered(msgspec.Struct, frozen=True):
    """Answer of ``PUT /nodes/{id}``.

    Attributes:
        node_id: the record id.
        host_id: the authenticated host.
        role: ``allocator`` (control record) or ``engine``.
        ttl_seconds: lease length; heartbeat well inside it.
        rejected_rows: residency rows dropped as malformed (non-empty makes the host unhealthy).
    """

    node_id: Id
    host_id: Id
    role: str
    ttl_seconds: float
    rejected_rows: Annotated[list[Text], msgspec.Meta(max_length=MAX_LIST)] = []


__all__ = [
    "HOST_ID_PATTERN",
    "JOIN_HEADER",
    "JOIN_TOKEN_TTL_S",
    "MAX_JOIN_TOKEN_TTL_S",
    "MAX_NODE_CREDENTIAL_TTL_S",
    "NODE_CREDENTIAL_TTL_S",
    "ClientKeyBody",
    "ClientKeyIssued",
    "EvaluationBody",
    "JoinFile",
    "JoinTokenBody",
    "JoinTokenIssued",
    "ModeBody",
    "NodeCredential",
    "Registered",
    "TokenBody",
]
