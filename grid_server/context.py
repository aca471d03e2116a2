"""Everything one server process shares between its HTTP handlers and background task."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grid_core.plugins import Plugins
from grid_server.auth import Credentials
from grid_server.client_keys import ClientKeys
from grid_server.metrics import RequestMetrics
from grid_server.registry import Registry
from grid_server.router import RouterState
from grid_server.runner import ControllerRunner

NO_DELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
"""Disable Nagle: httpx writes headers and body separately, and Nagle plus the peer's
delayed ACK would add ~40 ms to every small request."""


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
        client: the upstream connection pool, a :class:`~grid_server.upstream.UpstreamPool`
            (created in the app lifespan, on the running event loop).
        url: the bound base URL once serving.
        warnings: persistent-state or startup warnings shown in status.
        metrics: request, pass and action counters for ``/metrics``.
        ca_pem: the CA certificate the server was started with (``grid up --tls-ca``),
            served at ``/tls/ca.pem`` and pinned by join tokens; ``None`` without one.
        client_keys: the ``/v1`` client API keys and whether one is required.
        leadership: leader election on a replicated state store (``None`` on the file
            store, where this server is the only controller).
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
    ca_pem: bytes | None = None
    client_keys: ClientKeys | None = None
    leadership: Any = None
    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        router = self.router
        runner = self.runner

        def known(model: str) -> bool:
            return model in runner.profile_ids or model in router.routed_models()

        self.metrics = RequestMetrics(known)
