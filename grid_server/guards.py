"""Litestar route guards for the two control credentials.

Source: the specification's "HTTP control surface". A guard runs before the body is read, so a
request without the right credential is refused before any decoding work. A refusal is a
:class:`~grid_core.errors.AuthError` (401) or :class:`~grid_core.errors.ForbiddenError` (403)
rendered by the app's one error handler.
"""

from __future__ import annotations

import time

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from grid_core.client import plain_http_refusal
from grid_core.errors import ForbiddenError
from grid_core.wire import CONTROL_HEADER, OPERATOR_HEADER
from grid_server.auth import Credentials, NodeClaims, bearer

NODE_CLAIMS = "grid_node_claims"
"""Key of the verified node claims in the connection state (set by the node guard)."""


def check_transport(connection: ASGIConnection) -> None:
    """Refuse a credential that crossed the network over plain HTTP (the rule is the client's,
    :func:`grid_core.client.plain_http_refusal`: HTTPS, or plain HTTP from loopback only).

    Raises:
        ForbiddenError: plain HTTP from a peer that is not loopback.
    """
    peer = connection.client.host if connection.client else None
    refusal = plain_http_refusal(str(connection.scope.get("scheme", "http")), peer)
    if refusal is not None:
        raise ForbiddenError(refusal)


def operator_guard(credentials: Credentials) -> Guard:
    """A guard admitting only the operator capability (``X-Grid-Allocator-Token`` or Bearer).

    Raises (from the guard):
        ForbiddenError: the capability came over plain HTTP from off loopback.
        AuthError: missing or wrong capability.
    """

    def guard(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
        check_transport(connection)
        headers = connection.headers
        token = headers.get(OPERATOR_HEADER) or bearer(headers.get("authorization"))
        credentials.check_operator(token)

    return guard


def node_guard(credentials: Credentials) -> Guard:
    """A guard admitting a valid, unexpired node credential; its claims go to the state.

    Raises (from the guard):
        ForbiddenError: the credential came over plain HTTP from off loopback.
        AuthError: missing, malformed, forged or expired credential.
    """

    def guard(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
        check_transport(connection)
        claims = credentials.verify_node(connection.headers.get(CONTROL_HEADER), time.time())
        connection.state[NODE_CLAIMS] = claims

    return guard


def node_claims(connection: ASGIConnection) -> NodeClaims:
    """The claims the node guard verified for this request."""
    claims = connection.state[NODE_CLAIMS]
    assert isinstance(claims, NodeClaims)
    return claims
