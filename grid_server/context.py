"""Everything one server process shares between its HTTP handlers and background task."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from grid_core.plugins import Plugins
from grid_server.auth import Credentials
from grid_server.registry import Registry
from grid_server.router import RouterState
from grid_server.runner import ControllerRunner

UPSTREAM_CONNECT_TIMEOUT_S = 5.0
"""Connecting to a loopback or LAN engine takes milliseconds; five seconds means it is gone."""
UPSTREAM_READ_TIMEOUT_S = 600.0
"""Gap allowed between upstream bytes: a long prompt's prefill on a slow CPU can take minutes."""
UPSTREAM_POOL_TIMEOUT_S = 30.0
"""Wait for a pooled connection before giving up with 502."""
UPSTREAM_MAX_CONNECTIONS = 512
"""Shared pool size: far above one machine's engines × their slots."""
UPSTREAM_KEEPALIVE = 256
"""Idle keep-alive connections retained (reuse avoids a TCP handshake per request)."""


NO_DELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
"""Disable Nagle: httpx writes headers and body separately, and Nagle plus the peer's
delayed ACK would add ~40 ms to every small request."""


UPSTREAM_TIMEOUT = httpx.Timeout(
    UPSTREAM_READ_TIMEOUT_S, connect=UPSTREAM_CONNECT_TIMEOUT_S, pool=UPSTREAM_POOL_TIMEOUT_S
)
UPSTREAM_EXTENSIONS = {"timeout": UPSTREAM_TIMEOUT.as_dict()}
"""Per-request timeouts, given to the transport directly (there is no client layer)."""


def upstream_transport() -> httpx.AsyncHTTPTransport:
    """The shared connection pool for the upstream hop.

    The proxy talks to httpx's transport directly: the client layer's cookie, auth,
    redirect and environment-proxy handling has no job on this hop and costs CPU per request.
    The transport never retries (a failed POST is not replayed).
    """
    return httpx.AsyncHTTPTransport(
        socket_options=NO_DELAY,
        retries=0,
        limits=httpx.Limits(
            max_connections=UPSTREAM_MAX_CONNECTIONS, max_keepalive_connections=UPSTREAM_KEEPALIVE
        ),
    )


@dataclass
class ServerContext:
    """Shared state of one server process.

    Attributes:
        home: the Grid home directory.
        credentials: operator capability and node-credential signer.
        registry: node records.
        router: in-flight counts, breakers, measurements.
        runner: the controller runner.
        plugins: loaded plugins (classifier for ``model: auto``), may be ``None``.
        client: the upstream transport pool (created in the app lifespan).
        url: the bound base URL once serving.
        warnings: persistent-state or startup warnings shown in status.
    """

    home: Path
    credentials: Credentials
    registry: Registry
    router: RouterState
    runner: ControllerRunner
    plugins: Plugins | None
    client: Any = None
    url: str | None = None
    warnings: list[str] = field(default_factory=list)
