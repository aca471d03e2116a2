"""The server application: Litestar for control routes, a lean ASGI proxy for ``/v1``.

``build_app`` wires one :class:`~grid_server.context.ServerContext`; the returned ASGI
callable sends ``/v1/*`` straight to the proxy (no framework work on the hot path) and
everything else, including lifespan, to Litestar.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from litestar import Litestar, Response, Router, get
from litestar.exceptions import HTTPException

from grid_core.errors import AuthError, GridError, StateError
from grid_core.plugins import Plugins
from grid_server.api_allocator import allocator_routes
from grid_server.api_nodes import node_routes
from grid_server.api_observe import DemandHistory, observe_routes
from grid_server.auth import Credentials
from grid_server.client_keys import ClientKeys
from grid_server.context import ServerContext
from grid_server.home import STATE_DIR
from grid_server.http import (
    MAX_CONTROL_BODY_BYTES,
    bounded_json,
    json_response,
    on_grid_error,
    on_http_exception,
)
from grid_server.openapi import add_openai_routes, openapi_config
from grid_server.proxy import Proxy, ProxyError, Receive, Scope, Send
from grid_server.registry import Registry
from grid_server.router import RouterState
from grid_server.runner import REGISTRATION_GRACE_S, TICK_INTERVAL_S, ControllerRunner
from grid_server.upstream import UpstreamPool

log = logging.getLogger("grid.server")

STATE_FILE = "controller.json"


def grid_version() -> str:
    """The installed package version (shown in the OpenAPI document)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grid")
    except PackageNotFoundError:
        return "0+unknown"


def make_controller(
    home: Path,
    plugins: Plugins,
    state_dir: Path | None = None,
    policy: Any | None = None,
    store: Any | None = None,
    controller_id: str | None = None,
) -> tuple[Any, list[str]]:
    """The controller restored from ``store`` (default: the file store under
    ``$GRID_HOME/state``).

    Returns:
        ``(controller, warnings)``; a warning explains any fallback (for status).

    Raises:
        StateError: the file store's directory cannot be created (named, with the fix).
    """
    from grid_core.controller import Controller

    warnings: list[str] = []
    if store is not None:
        ctl = Controller(plugins=plugins, store=store, policy=policy, controller_id=controller_id)
        return ctl.restore(), warnings
    state_dir = state_dir or home / STATE_DIR
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        msg = (
            f"cannot create the controller state directory {state_dir}: {exc.strerror}; "
            "give --state-dir a directory you can write"
        )
        raise StateError(msg) from None
    try:
        from grid_server.store import FileStateStore

        store = FileStateStore(state_dir / STATE_FILE)
    except ImportError:
        from grid_core.store import MemoryStore

        store = MemoryStore()
        warnings.append("no durable state store available: automatic mode is refused")
    return Controller(plugins=plugins, store=store, policy=policy).restore(), warnings


class GridApp:
    """The ASGI entry point: proxy for ``/v1/*``, Litestar for the rest."""

    def __init__(self, ctx: ServerContext, litestar: Litestar) -> None:
        self.ctx = ctx
        self.litestar = litestar
        self.proxy = Proxy(ctx)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            keys = self.ctx.client_keys
            if keys is not None and keys.required:
                try:
                    keys.check(_header(scope, b"authorization"))
                except AuthError as exc:
                    refusal = ProxyError(
                        401, str(exc), "invalid_api_key", kind="authentication_error"
                    )
                    await refusal.answer(send)
                    return
            await self.proxy(scope, receive, send)
        else:
            # The raw ASGI mappings uvicorn hands us; Litestar types each event as a TypedDict.
            await self.litestar(scope, receive, send)  # type: ignore[arg-type]  # raw ASGI


def _header(scope: Scope, name: bytes) -> str | None:
    """One request header (lowercase ``name``) from a raw ASGI scope, decoded as Latin-1."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def leader_election(
    state_store: Any,
    runner: ControllerRunner,
    build: Callable[[str], Any],
    lease_s: float,
    credentials: Credentials,
    tls_ca: Path | None,
) -> Any:
    """The :class:`~grid_server.leadership.Leadership` of a server on a replicated store,
    with the runner's demand forwarder wired to it (a follower sends the requests it answers
    to the leader with the operator token).

    Args:
        state_store: the replicated state store.
        runner: this server's controller runner (its controller is replaced on takeover).
        build: makes a controller for a controller id.
        lease_s: the controller lease length (seconds).
        credentials: this server's credentials (the operator token is read at send time).
        tls_ca: the CA that signed the servers' certificates (verifies the leader's).
    """
    from grid_server.forwarding import DemandForwarder
    from grid_server.leadership import Leadership

    leadership = Leadership(state_store, runner, build, lease_s=lease_s)
    runner.forwarder = DemandForwarder(
        leadership,
        runner.observe_here,
        lambda: credentials.operator_token_path.read_text().strip(),
        ca_file=tls_ca,
    )
    return leadership


def server_lifespan(
    ctx: ServerContext,
    on_ready: Callable[[ServerContext], None] | None,
    on_stopped: Callable[[], None] | None,
) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """The server's lifespan: the upstream pool, then the controller runner, leader election
    and demand forwarding as tasks until shutdown; on the way out a leader releases its lease
    at once (a follower takes over without waiting for it to expire)."""

    @asynccontextmanager
    async def lifespan(_app: Litestar) -> AsyncIterator[None]:
        runner, leadership = ctx.runner, ctx.leadership
        ctx.client = UpstreamPool()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(runner.run)
                if leadership is not None:
                    tg.start_soon(leadership.run)
                if runner.forwarder is not None:
                    tg.start_soon(runner.forwarder.run)
                if on_ready is not None:
                    on_ready(ctx)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            if leadership is not None:
                leadership.release()
            await ctx.client.aclose()
            if on_stopped is not None:
                on_stopped()

    return lifespan


def build_app(
    home: Path,
    plugins: Plugins,
    controller: Any | None = None,
    *,
    tick_interval_s: float = TICK_INTERVAL_S,
    state_dir: Path | None = None,
    on_ready: Callable[[ServerContext], None] | None = None,
    on_stopped: Callable[[], None] | None = None,
    policy: Any | None = None,
    tls_ca: Path | None = None,
    client_keys_required: bool = False,
    state_store: Any | None = None,
    registration_grace_s: float = REGISTRATION_GRACE_S,
) -> GridApp:
    """Assemble the server.

    Args:
        home: the Grid home (credentials and state live here).
        plugins: plugins for the controller and the classifier.
        controller: an existing controller (tests); built from ``home`` when ``None``.
        tick_interval_s: periodic pass interval (seconds).
        state_dir: where the controller state file lives (default ``$GRID_HOME/state``).
        on_ready: called once the lifespan has started (the socket is already listening).
        on_stopped: called when the lifespan ends (graceful shutdown).
        policy: a ``ControllerPolicy`` for a controller built here (defaults when ``None``).
        tls_ca: the CA certificate that signed the server's TLS certificate (served at
            ``/tls/ca.pem`` for join-token pinning).
        client_keys_required: every ``/v1`` request must carry a client API key
            (``grid up --client-keys``; the default off loopback).
        state_store: a replicated store (``grid up --state-store etcd://…``): this server
            then takes part in leader election (:mod:`grid_server.leadership`) instead of
            using the file store.
        registration_grace_s: seconds after start before a model may be called unplaceable
            (:data:`grid_server.runner.REGISTRATION_GRACE_S`; tests of a fresh grid use 0).

    Raises:
        StateError: a credential file is unreadable or too widely readable.
    """
    warnings: list[str] = []
    if controller is None:
        controller, warnings = make_controller(home, plugins, state_dir, policy, state_store)
    credentials = Credentials(home)
    # A host revoked before this start stays withdrawn: its pre-revocation writes are refused.
    registry = Registry(revoked=credentials.revoked)
    router = RouterState(registry)
    runner = ControllerRunner(
        controller,
        registry,
        router,
        interval_s=tick_interval_s,
        registration_grace_s=registration_grace_s,
    )
    leadership = None
    if state_store is not None:

        def build(controller_id: str) -> Any:
            return make_controller(home, plugins, None, policy, state_store, controller_id)[0]

        leadership = leader_election(
            state_store, runner, build, controller.policy.controller_lease_s, credentials, tls_ca
        )
    ctx = ServerContext(
        home=home,
        credentials=credentials,
        registry=registry,
        router=router,
        runner=runner,
        plugins=plugins,
        warnings=warnings,
        ca_pem=tls_ca.read_bytes() if tls_ca is not None else None,
        client_keys=ClientKeys(home, required=client_keys_required),
        leadership=leadership,
    )
    litestar = _litestar(ctx, server_lifespan(ctx, on_ready, on_stopped))
    add_openai_routes(litestar)
    return GridApp(ctx, litestar)


def _litestar(ctx: ServerContext, lifespan: Any) -> Litestar:
    """The Litestar application over ``ctx``: node, allocator and observation routes, the
    health check, typed error handlers, the control-plane body limit and the OpenAPI schema.

    Also wires the runner's request and tick observers to the metrics and the demand history.
    """
    history = DemandHistory.empty()
    runner = ctx.runner
    runner.on_request = ctx.metrics.observe_request

    def on_tick(seconds: float) -> None:
        ctx.metrics.observe_tick(seconds)
        history.sample(runner.ctl, time.time())

    runner.on_tick = on_tick

    @get("/healthz")
    async def healthz() -> Response:
        """Liveness: the server answers."""
        return json_response({"status": "ok"})

    return Litestar(
        route_handlers=[
            healthz,
            Router("/", route_handlers=node_routes(ctx), tags=["nodes"]),
            Router("/", route_handlers=allocator_routes(ctx), tags=["allocator"]),
            Router("/", route_handlers=observe_routes(ctx, history), tags=["observation"]),
        ],
        lifespan=[lifespan],
        exception_handlers={GridError: on_grid_error, HTTPException: on_http_exception},
        before_request=bounded_json,
        request_max_body_size=MAX_CONTROL_BODY_BYTES,
        logging_config=None,
        openapi_config=openapi_config(grid_version()),
    )
