"""A Grid gateway: the authenticated process in front of one model of a loopback service.

Some runtimes are services Grid does not start and that have no authentication (Ollama,
ComfyUI): they must stay on loopback, and the node serves each resident model through a
Grid-owned gateway child instead (identity proven like any engine child, specification
"Managed host actuator" and "Operations"). Every such gateway has the same outer shape, which
:class:`EngineGateway` implements once:

* ``GET /health`` — the service's own proof that the model is usable (the runtime supplies it);
* ``GET /v1/models`` — lists the one model, engine key required;
* ``GET /grid/activity`` — requests in flight (``{"active": n}``), engine key required, so a
  drain knows when the gateway is idle;
* the runtime's ``POST`` routes, each behind the engine key (:meth:`EngineGateway.routes`).

The engine key is read from the 0600 key file named on the command line
(:func:`read_keys`), never from argv or the environment. Errors use the OpenAI shape
``{"error": {"message", "type"}}``. :func:`run_gateway` is a gateway module's whole ``main``:
the shared flags (``--model --host --port --api-key-file --upstream``), the runtime's own,
then serving until the node stops the process.

The node side of the same arrangement is
:class:`~grid_core.gateway_adapter.GatewayAdapter`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

GatewayHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
"""An aiohttp request handler."""

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
"""aiohttp's own request-body bound (1 MiB): enough for an image request's fields."""


def read_keys(path: Path) -> set[str]:
    """The engine keys in a key file, one a line (blank lines ignored).

    Raises:
        OSError: the file cannot be read.
    """
    return {k.strip() for k in path.read_text().splitlines() if k.strip()}


class EngineGateway(ABC):
    """Base of a gateway process serving one model of a loopback service.

    Subclasses implement :meth:`health` and :meth:`routes`, and count
    each relayed request with :meth:`in_flight`.

    Args:
        model: the model id this gateway serves (what ``/v1/models`` lists).
        keys: accepted engine keys (``Authorization: Bearer <key>``).
        upstream: the service's loopback base URL (a trailing slash is dropped).

    Attributes:
        active: requests in flight (``GET /grid/activity``).
    """

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Largest request body accepted, in bytes (aiohttp answers 413 above it)."""

    def __init__(self, model: str, keys: set[str], upstream: str) -> None:
        self.model = model
        self.keys = keys
        self.upstream = upstream.rstrip("/")
        self.active = 0

    # --- what a runtime supplies ------------------------------------------------------------
    @abstractmethod
    async def health(self, request: web.Request) -> web.Response:
        """200 when the service can serve the model now, else 503 (see :meth:`unready`)."""

    @abstractmethod
    def routes(self) -> Sequence[tuple[str, GatewayHandler]]:
        """``(path, handler)`` of every ``POST`` route the gateway relays."""

    # --- shared helpers ---------------------------------------------------------------------
    def authorized(self, request: web.Request) -> bool:
        """The request carries one of the engine keys (compared in constant time)."""
        got = request.headers.get("Authorization", "")
        return any(hmac.compare_digest(got, f"Bearer {k}") for k in self.keys)

    @staticmethod
    def error(status: int, message: str, kind: str) -> web.Response:
        """An OpenAI-shaped error response (``kind``: ``invalid_request_error`` …)."""
        return web.json_response({"error": {"message": message, "type": kind}}, status=status)

    def refused(self) -> web.Response:
        """The 401 answer to a request without a valid engine key."""
        return self.error(401, "invalid api key", "authentication_error")

    @staticmethod
    def unready(why: str) -> web.Response:
        """A 503 health answer saying why the model is not servable."""
        return web.json_response({"status": why}, status=503)

    async def request_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The JSON object body of an authorized request, or the 401/400 answer to return."""
        if not self.authorized(request):
            return self.refused()
        try:
            body = await request.json()
        except ValueError:
            return self.error(400, "request body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return self.error(400, "request body must be an object", "invalid_request_error")
        return body

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Count one request as active for the duration of the block."""
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1

    # --- shared routes ----------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: the one model (engine key required)."""
        if not self.authorized(request):
            return self.refused()
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        )

    async def activity(self, request: web.Request) -> web.Response:
        """``GET /grid/activity``: ``{"active": n}`` (engine key required)."""
        if not self.authorized(request):
            return self.refused()
        return web.json_response({"active": self.active})

    def app(self) -> web.Application:
        """The aiohttp application: shared routes, then the runtime's ``POST`` routes."""
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/grid/activity", self.activity)
        for path, handler in self.routes():
            app.router.add_post(path, handler)
        return app


async def serve(gateway: EngineGateway, *, kind: str, model: str, host: str, port: int) -> None:
    """Serve ``gateway`` on ``host:port`` until the process is stopped.

    Prints one JSON line (``{"gateway": kind, "model": model, "port": port}``) once listening.
    """
    runner = web.AppRunner(gateway.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(json.dumps({"gateway": kind, "model": model, "port": port}), flush=True)
    await asyncio.Event().wait()


def run_gateway(
    argv: Sequence[str],
    *,
    kind: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    build: Callable[[argparse.Namespace, set[str]], EngineGateway],
) -> int:
    """A gateway module's ``main``: parse the flags, build the gateway, serve it.

    Shared flags: ``--model`` (required), ``--host`` (default 127.0.0.1), ``--port``
    (required), ``--api-key-file`` (required, 0600) and ``--upstream`` (required).

    Args:
        argv: the arguments after the program name.
        kind: the runtime's name (``ollama``); the program is ``grid-<kind>-gateway``.
        add_arguments: adds the runtime's own flags to the parser.
        build: makes the gateway from the parsed arguments and the engine keys.

    Returns:
        Never returns while serving; argparse exits with status 2 on bad flags.
    """
    p = argparse.ArgumentParser(prog=f"grid-{kind}-gateway")
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key-file", type=Path, required=True)
    p.add_argument("--upstream", required=True)
    add_arguments(p)
    args = p.parse_args(list(argv))
    gateway = build(args, read_keys(args.api_key_file))
    asyncio.run(serve(gateway, kind=kind, model=args.model, host=args.host, port=args.port))
    return 0
