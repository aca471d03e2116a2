"""The OpenAI-compatible proxy: ``/v1/models`` and the three POST endpoints.

A plain ASGI callable mounted in front of the Litestar app so the hot path does no routing,
validation or middleware work it does not need. Source: the specification's "HTTP control
surface", "Global placement loop" (request routing) and "Proactive observation".

Rules kept here:

* a request for a model with no ready route gets 503 + ``Retry-After`` (OpenAI error shape);
  an unknown model 404; a non-JSON body 400; a body over :data:`MAX_BODY_BYTES` 413;
* the engine's private key is added on the upstream hop and never forwarded back; the
  caller's own ``Authorization`` and the affinity key are never forwarded;
* a failed POST is never replayed; the breaker only steers later requests;
* observation (features, measurements) happens after the response and never raises.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import msgspec

from grid_core import routing
from grid_core.demand.features import EndpointFamily, Outcome
from grid_server import telemetry
from grid_server.context import UPSTREAM_EXTENSIONS
from grid_server.sse import MAX_JSON_BODY_BYTES, UsageScanner, usage_from_json

if TYPE_CHECKING:
    from grid_server.context import ServerContext
    from grid_server.router import Route

log = logging.getLogger("grid.server.proxy")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body: a long context plus a few inline images; more is refused with 413."""
NO_ROUTE_RETRY_AFTER_S = 5
"""Retry-After for a configured model with no ready engine: about one warm-up probe period."""
AUTO_MODEL = "auto"
"""Model name for unbound work: Grid chooses the model from the workload."""
JSON_HEADERS = [(b"content-type", b"application/json")]
_FORWARD_RESPONSE_HEADERS = frozenset({b"content-type", b"cache-control", b"content-length"})
"""Response headers passed back to the caller; the body is relayed byte for byte, so its
length stays true (the upstream hop asks for identity encoding)."""


def error_body(status: int, message: str, kind: str, code: str | None = None) -> bytes:
    """An OpenAI-shaped error document."""
    return msgspec.json.encode(
        {"error": {"message": message, "type": kind, "param": None, "code": code or status}}
    )


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send a complete small response."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": (headers or JSON_HEADERS) + [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    """The request body exceeded :data:`MAX_BODY_BYTES`."""


async def read_body(scope: Scope, receive: Receive, limit: int = MAX_BODY_BYTES) -> bytes:
    """Read the whole request body, refusing more than ``limit`` bytes early."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        chunk = msg.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Proxy:
    """ASGI callable for ``/v1/*``."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        method = scope["method"]
        endpoint = telemetry.ENDPOINTS.get(path)
        if endpoint is not None and method == "POST":
            await self._proxy(scope, receive, send, path, endpoint)
        elif path == "/v1/models" and method == "GET":
            await respond(send, 200, self._models())
        else:
            await respond(
                send,
                404,
                error_body(404, f"no route {method} {path}", "invalid_request_error", "not_found"),
            )

    # --- /v1/models ---------------------------------------------------------------------
    def _models(self) -> bytes:
        now = time.time()
        mono = time.monotonic()
        router = self.ctx.router
        data = []
        for model in sorted(router.routed_models()):
            cands = router.candidates(router.routes(model), now, mono, breakers=False)
            if any(routing.eligible(c) for c in cands):
                data.append({"id": model, "object": "model", "created": 0, "owned_by": "grid"})
        return msgspec.json.encode({"object": "list", "data": data})

    # --- POST endpoints -----------------------------------------------------------------
    async def _proxy(
        self, scope: Scope, receive: Receive, send: Send, path: str, endpoint: EndpointFamily
    ) -> None:
        t0 = time.perf_counter()
        try:
            body = await read_body(scope, receive)
        except BodyTooLarge:
            await respond(
                send,
                413,
                error_body(
                    413,
                    f"request body exceeds {MAX_BODY_BYTES} bytes; send a smaller request",
                    "invalid_request_error",
                    "request_too_large",
                ),
            )
            return
        try:
            doc = msgspec.json.decode(body)
        except msgspec.DecodeError:
            await respond(
                send,
                400,
                error_body(
                    400, "request body is not valid JSON", "invalid_request_error", "invalid_json"
                ),
            )
            return
        model = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(model, str) or not model:
            await respond(
                send,
                400,
                error_body(
                    400,
                    "request needs a string 'model' field",
                    "invalid_request_error",
                    "missing_model",
                ),
            )
            return
        affinity_hash = None
        for name, value in scope["headers"]:
            if name == b"x-grid-affinity-key":
                affinity_hash = routing.hash_affinity_key(value.decode("utf-8", "replace"))
                break
        shape = telemetry.shape_of(endpoint, doc)
        workload: str | None = None
        served = model
        if model == AUTO_MODEL:
            workload = self._classify(endpoint, shape)
            served = self._auto_model(workload)
            if served is not None:
                doc["model"] = served
                body = msgspec.json.encode(doc)
        now = time.time()
        mono = time.monotonic()
        route = self._pick(served, shape, affinity_hash, now, mono) if served else None
        if route is None:
            known = served is not None and (
                served in self.ctx.runner.profile_ids or served in self.ctx.router.routed_models()
            )
            if model != AUTO_MODEL and not known:
                await respond(
                    send,
                    404,
                    error_body(
                        404,
                        f"model '{model}' is not served by this grid; see GET /v1/models",
                        "invalid_request_error",
                        "model_not_found",
                    ),
                )
                outcome: Outcome = "client_error"
            else:
                await respond(
                    send,
                    503,
                    error_body(
                        503,
                        f"model '{model}' has no ready engine right now; retry later",
                        "server_error",
                        "model_not_ready",
                    ),
                    [*JSON_HEADERS, (b"retry-after", str(NO_ROUTE_RETRY_AFTER_S).encode())],
                )
                outcome = "unavailable"
            self._observe(
                now,
                endpoint,
                model,
                None,
                shape,
                None,
                workload,
                None,
                time.perf_counter() - t0,
                outcome,
                affinity_hash,
            )
            return
        await self._forward(
            scope,
            receive,
            send,
            path,
            endpoint,
            body,
            model,
            route,
            shape,
            workload,
            affinity_hash,
            t0,
        )

    def _pick(
        self, model: str, shape: telemetry.Shape, affinity_hash: str | None, now: float, mono: float
    ) -> Route | None:
        router = self.ctx.router
        routes = router.routes(model)
        if not routes:
            return None
        if len(routes) == 1:
            cands = router.candidates(routes, now, mono)
            return routes[0] if routing.eligible(cands[0]) else None
        cands = router.candidates(routes, now, mono)
        chosen = routing.choose_route(
            cands, now, max_tokens=shape.max_tokens, affinity_hash=affinity_hash
        )
        if chosen is None:
            return None
        return next(r for r in routes if r.engine.record_id == chosen)

    def _classify(self, endpoint: EndpointFamily, shape: telemetry.Shape) -> str | None:
        vocabulary = self.ctx.runner.vocabulary
        plugins = self.ctx.plugins
        if plugins is None or not vocabulary:
            return None
        probe = telemetry.features(
            at=time.time(),
            endpoint=endpoint,
            requested_model=AUTO_MODEL,
            served_model=None,
            shape=shape,
            output_units=None,
            workload=None,
            service_time_s=None,
            queue_s=0.0,
            outcome="ok",
            affinity_hash=None,
        )
        try:
            workload = plugins.classify_request(probe, shape.text_prefix, vocabulary)
        except Exception:  # a broken classifier must never fail inference
            log.warning("request classifier raised; treating the request as unclassified")
            return None
        return workload if workload in vocabulary else None

    def _auto_model(self, workload: str | None) -> str | None:
        """The ready model best suited to ``workload`` (configured workload scores)."""
        now = time.time()
        mono = time.monotonic()
        router = self.ctx.router
        profiles = self.ctx.runner.profiles
        ready = [
            m
            for m in router.routed_models()
            if any(routing.eligible(c) for c in router.candidates(router.routes(m), now, mono))
        ]
        if not ready:
            return None

        def score(m: str) -> tuple[float, str]:
            p = profiles.get(m)
            s = p.workload_scores.get(workload, 0.0) if (p and workload) else 0.0
            return (-s, m)

        return min(ready, key=score)

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        path: str,
        endpoint: EndpointFamily,
        body: bytes,
        model: str,
        route: Route,
        shape: telemetry.Shape,
        workload: str | None,
        affinity_hash: str | None,
        t0: float,
    ) -> None:
        ctx = self.ctx
        router = ctx.router
        eng = route.engine
        # identity: the body is relayed raw and scanned for usage, so it must not be
        # compressed on the upstream hop (httpx would otherwise offer gzip/br).
        headers = {
            "content-type": "application/json",
            "accept-encoding": "identity",
            "accept": "text/event-stream" if shape.stream else "application/json",
        }
        key = ctx.registry.engine_key(eng.record_id)
        if key:
            headers["authorization"] = f"Bearer {key}"
        mono = time.monotonic()
        router.begin(route, mono)
        queue_s = time.perf_counter() - t0
        t_up = time.perf_counter()
        outcome: routing.BreakerOutcome = "failure"
        status = 502
        tokens: int | None = None
        started = False
        try:
            request = httpx.Request(
                "POST",
                _upstream_url(eng.url, path),
                content=body,
                headers=headers,
                extensions=UPSTREAM_EXTENSIONS,
            )
            try:
                upstream = await ctx.client.handle_async_request(request)
            except httpx.HTTPError as exc:
                await respond(
                    send,
                    502,
                    error_body(
                        502,
                        f"engine for '{route.model_id}' could not be reached "
                        f"({type(exc).__name__}); the request was not retried",
                        "server_error",
                        "upstream_unreachable",
                    ),
                )
                return
            try:
                status = upstream.status_code
                outcome = _classify_status(status)
                if status in (401, 403):
                    # The engine refused Grid's private key: a registry problem, not the
                    # caller's. Its body is not forwarded (it could echo credentials).
                    await respond(
                        send,
                        502,
                        error_body(
                            502,
                            f"engine for '{route.model_id}' refused Grid's credential",
                            "server_error",
                            "upstream_auth",
                        ),
                    )
                    return
                resp_headers = [
                    (k, v)
                    for k, v in upstream.headers.raw
                    if k.lower() in _FORWARD_RESPONSE_HEADERS
                ]
                await send(
                    {"type": "http.response.start", "status": status, "headers": resp_headers}
                )
                started = True
                gone, tokens = await _relay(upstream, status, send, receive)
                if gone:
                    # The caller hung up: closing the upstream stream stops generation.
                    outcome = "client_error"
            finally:
                await upstream.aclose()
        except httpx.HTTPError:
            outcome = "failure"
            if not started:
                await respond(
                    send,
                    502,
                    error_body(
                        502,
                        f"engine for '{route.model_id}' failed mid-response; not retried",
                        "server_error",
                        "upstream_error",
                    ),
                )
        except OSError:
            # The client went away; the engine did nothing wrong.
            outcome = "client_error"
        finally:
            service_s = time.perf_counter() - t_up
            now = time.time()
            try:
                router.finish(
                    route, outcome, time.monotonic(), now, service_s * 1000.0, tokens, service_s
                )
            except Exception:  # observation never fails a response
                log.exception("router bookkeeping failed")
            self._observe(
                now,
                endpoint,
                model,
                route.model_id,
                shape,
                tokens,
                workload,
                service_s,
                queue_s,
                _feature_outcome(outcome, status),
                affinity_hash,
            )

    def _observe(
        self,
        now: float,
        endpoint: EndpointFamily,
        requested: str,
        served: str | None,
        shape: telemetry.Shape,
        tokens: int | None,
        workload: str | None,
        service_s: float | None,
        queue_s: float,
        outcome: Outcome,
        affinity_hash: str | None,
    ) -> None:
        try:
            self.ctx.runner.observe(
                telemetry.features(
                    at=now,
                    endpoint=endpoint,
                    requested_model=requested,
                    served_model=served,
                    shape=shape,
                    output_units=tokens,
                    workload=workload,
                    service_time_s=service_s,
                    queue_s=queue_s,
                    outcome=outcome,
                    affinity_hash=affinity_hash,
                )
            )
        except Exception:  # observation is best effort
            log.exception("request observation failed")


async def _relay(
    upstream: httpx.Response, status: int, send: Send, receive: Receive
) -> tuple[bool, int | None]:
    """Relay the upstream body; returns (caller hung up, completion tokens if known)."""
    if b"text/event-stream" in upstream.headers.get("content-type", "").encode():
        scanner = UsageScanner()
        gone = await _relay_watching(upstream, scanner, send, receive)
        ok = 200 <= status < 300 and not gone
        return gone, scanner.completion_tokens if ok else None
    whole: list[bytes] = []
    size = 0
    async for chunk in upstream.aiter_raw():
        if size <= MAX_JSON_BODY_BYTES:
            whole.append(chunk)
            size += len(chunk)
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
    if 200 <= status < 300 and whole:
        return False, usage_from_json(b"".join(whole))[0]
    return False, None


async def _relay_watching(
    upstream: httpx.Response, scanner: UsageScanner, send: Send, receive: Receive
) -> bool:
    """Relay an SSE stream chunk by chunk; stop early when the caller disconnects.

    Returns:
        True when the caller went away before the stream ended.
    """
    gone = False
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        async for chunk in upstream.aiter_raw():
            scanner.feed(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        tg.cancel_scope.cancel()
    return gone


_URLS: dict[tuple[str, str], httpx.URL] = {}
MAX_CACHED_URLS = 4096
"""Parsed upstream URLs kept (engines × endpoints); cleared when full."""


def _upstream_url(base: str, path: str) -> httpx.URL:
    key = (base, path)
    url = _URLS.get(key)
    if url is None:
        if len(_URLS) >= MAX_CACHED_URLS:
            _URLS.clear()
        url = _URLS[key] = httpx.URL(base + path)
    return url


def _classify_status(status: int) -> routing.BreakerOutcome:
    if 200 <= status < 300:
        return "success"
    if status == 429:
        return "rate_limited"
    if status >= 500 or status in (401, 403):
        return "failure"
    return "client_error"


def _feature_outcome(outcome: routing.BreakerOutcome, status: int) -> Outcome:
    if outcome == "success":
        return "ok"
    if outcome == "rate_limited":
        return "rejected"
    if outcome == "client_error":
        return "client_error"
    return "error"
