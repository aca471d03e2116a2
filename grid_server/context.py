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


def upstream_client() -> httpx.AsyncClient:
    """The shared connection pool for the upstream hop (no environment proxies, no retries)."""
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(socket_options=NO_DELAY, retries=0,
                                           limits=httpx.Limits(
                                               max_connections=UPSTREAM_MAX_CONNECTIONS,
                                               max_keepalive_connections=UPSTREAM_KEEPALIVE)),
        timeout=httpx.Timeout(UPSTREAM_READ_TIMEOUT_S, connect=UPSTREAM_CONNECT_TIMEOUT_S,
                              pool=UPSTREAM_POOL_TIMEOUT_S),
        trust_env=False,
        follow_redirects=False,
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
        client: the upstream pool (created in the app lifespan).
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
