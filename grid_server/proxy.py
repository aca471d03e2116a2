"""The OpenAI-compatible proxy: ``/v1/models`` and the three POST endpoints.

A plain ASGI callable mounted in front of the Litestar app so the hot path does no routing,
validation or middleware work it does not need. Source: the specification's "HTTP control
surface", "Global placement loop" (request routing, circuit breaker) and "Proactive
observation".

A POST goes through four steps, all working on one per-request :class:`Exchange`:

1. **parse** — read the bounded body, the model, the affinity key and the request's shape;
2. **resolve** — choose one ready engine below its admission limit (a short bounded wait
   when every ready engine is saturated);
3. **relay** — one upstream POST, its answer classified as caller- or engine-caused,
   relayed byte for byte; the caller leaving cancels the upstream request at any point;
4. **observe** — breaker, in-flight count, measurements and demand features, once.

Any step refuses with :class:`ProxyError`; one handler turns it into the caller's
OpenAI-shaped answer. Rules kept here: the engine's private key is added on the upstream
hop and never forwarded back; the caller's ``Authorization`` and affinity key are never
forwarded; a POST that may have reached an engine is never replayed (the breaker only steers
later requests), while one whose connection failed before any byte was written goes to
another ready replica.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import msgspec

from grid_core import routing
from grid_core.demand.features import EndpointFamily, Outcome
from grid_core.errors import AuthError
from grid_core.wire import OPERATOR_HEADER, WireError, check_json_depth
from grid_server import telemetry
from grid_server.relay import NothingSent, relay

if TYPE_CHECKING:
    from grid_server.context import ServerContext
    from grid_server.router import Route

log = logging.getLogger("grid.server.proxy")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body: a long context plus a few inline images; more is refused with 413."""
AUTO_MODEL = "auto"
EVALUATION_HEADER = b"x-grid-evaluation"
"""Marks a request as an operator evaluation: engine performance learns from it, demand
does not (specification: only the operator capability may mark it)."""
OPERATOR_HEADER_RAW = OPERATOR_HEADER.lower().encode()
"""Model name for unbound work: Grid chooses the model from the workload."""
ADMISSION_WAIT_S = 15.0
"""Longest a request waits in Grid's queue for a slot when every ready engine of its model is
saturated: about as long as the engine's own queue would have held it during a burst (a
trace replay at 10x speed fills a two-slot engine for seconds), but the request takes
whichever engine frees first and never piles onto a saturated one. Beyond it: 503 with
Retry-After."""
MAX_UNSENT_ATTEMPTS = 3
"""Engines one request may try when connecting fails before anything was sent: enough to
step past a replica killed a moment ago (its route lingers until the node withdraws it) and
one more, without a dead fleet turning every request into a scan of every engine."""
MAX_WAITING_PER_MODEL = 256
"""Requests of one model allowed to wait for a slot at once; beyond it Grid answers 503 at
once (a bounded queue never becomes an unbounded pile on a saturated engine)."""
JSON_HEADERS = [(b"content-type", b"application/json")]
MODELS_PREFIX = "/v1/models/"


REQUIRED_FIELDS: dict[EndpointFamily, str] = {
    "chat": "messages",
    "completions": "prompt",
    "embeddings": "input",
}
"""The input field each OpenAI endpoint family cannot do without (OpenAI API reference); a
request without it is refused by Grid with ``param`` naming it, before any engine is woken."""


def error_body(
    status: int, message: str, kind: str, code: str | None = None, param: str | None = None
) -> bytes:
    """An OpenAI-shaped error document: ``code`` is a short string (or null) and ``param``
    names the offending request field when one is to blame, as OpenAI's API does."""
    return msgspec.json.encode(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}
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


class ProxyError(Exception):
    """A step refuses the request; the single error path answers the caller with it.

    Attributes:
        status: HTTP status for the caller.
        message: one line naming what is wrong and what to do.
        kind: OpenAI error ``type``.
        code: OpenAI error ``code``.
        outcome: what demand tracking records for it.
        retry_after_s: ``Retry-After`` seconds, when the caller should come back.
        param: the request field to blame, when one is.
        headers: extra response headers (e.g. ``Allow`` on a 405).
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        *,
        kind: str | None = None,
        outcome: Outcome | None = None,
        retry_after_s: int | None = None,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
        self.outcome: Outcome = outcome or ("error" if status >= 500 else "client_error")
        self.retry_after_s = retry_after_s
        self.param = param
        self.headers = headers or []

    async def answer(self, send: Send) -> None:
        """Send this error as a complete OpenAI-shaped response."""
        headers = [*JSON_HEADERS, *self.headers]
        if self.retry_after_s is not None:
            headers.append((b"retry-after", str(self.retry_after_s).encode()))
        body = error_body(self.status, self.message, self.kind, self.code, self.param)
        await respond(send, self.status, body, headers)


class Exchange:
    """Everything one proxied POST carries through the four steps.

    Attributes:
        scope / receive / send: the ASGI triple.
        path: request path; endpoint: its family (chat, completions, embeddings).
        t0: ``perf_counter`` at arrival.
        body: the request body (re-encoded when ``auto`` was resolved).
        requested: the model the caller named; served: the model Grid routes to.
        shape: bounded request features (sizes, stream flag, output hint).
        workload: classified workload of an ``auto`` request.
        affinity_hash: digest of the caller's affinity key.
        evaluation: the operator marked this request as an evaluation (``X-Grid-Evaluation``
            with the operator capability): it is never demand.
        route: the chosen engine once resolved; began: the router counted it in flight.
        status: the status the caller received; breaker: outcome for the engine's breaker.
        outcome: outcome for demand tracking; tokens: completion tokens from usage.
        started: the response has started (errors can no longer be answered).
        completed: the response was sent completely; gone: the caller left before that.
        queue_s: seconds from arrival to the upstream request; service_s: upstream seconds.
    """

    __slots__ = (
        "affinity_hash",
        "began",
        "body",
        "breaker",
        "completed",
        "endpoint",
        "evaluation",
        "gone",
        "outcome",
        "path",
        "queue_s",
        "receive",
        "requested",
        "route",
        "scope",
        "send",
        "served",
        "service_s",
        "shape",
        "started",
        "status",
        "t0",
        "tokens",
        "workload",
    )

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, path: str, endpoint: EndpointFamily
    ) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.path = path
        self.endpoint = endpoint
        self.t0 = time.perf_counter()
        self.body = b""
        self.requested = ""
        self.served: str | None = None
        self.shape = telemetry.Shape()
        self.workload: str | None = None
        self.affinity_hash: str | None = None
        self.evaluation = False
        self.route: Route | None = None
        self.began = False
        self.status = 0
        self.breaker: routing.BreakerOutcome = "failure"
        self.outcome: Outcome = "error"
        self.tokens: int | None = None
        self.started = False
        self.completed = False
        self.gone = False
        self.queue_s = 0.0
        self.service_s: float | None = None

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Start the caller's response."""
        self.status = status
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body_chunk(self, chunk: bytes) -> None:
        """Send one body chunk (more follows)."""
        await self.send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def finish(self) -> None:
        """End the caller's response; from here a disconnect is not a hang-up."""
        self.completed = True
        await self.send({"type": "http.response.body", "body": b""})


class Proxy:
    """ASGI callable for ``/v1/*``."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.retries = telemetry.RetryLedger()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        method = scope["method"]
        endpoint = telemetry.ENDPOINTS.get(path)
        if endpoint is not None and method == "POST":
            await self.handle(Exchange(scope, receive, send, path, endpoint))
        elif path == "/v1/models" and method == "GET":
            await respond(send, 200, self._models())
        elif path.startswith(MODELS_PREFIX) and method == "GET":
            await self._model(send, path[len(MODELS_PREFIX) :])
        elif endpoint is not None or path == "/v1/models" or path.startswith(MODELS_PREFIX):
            allowed = "POST" if endpoint is not None else "GET"
            await ProxyError(
                405,
                f"{method} is not allowed on {path}; use {allowed}",
                "method_not_allowed",
                headers=[(b"allow", allowed.encode())],
            ).answer(send)
        else:
            await ProxyError(404, f"no route {method} {path}", "not_found").answer(send)

    # --- GET /v1/models and /v1/models/{id} --------------------------------------------------
    def _ready_models(self) -> list[str]:
        now = time.time()
        mono = time.monotonic()
        router = self.ctx.router
        return [
            m
            for m in sorted(router.routed_models())
            if any(
                routing.eligible(c)
                for c in router.candidates(router.routes(m), now, mono, breakers=False)
            )
        ]

    def _models(self) -> bytes:
        data = [_model_doc(m) for m in self._ready_models()]
        return msgspec.json.encode({"object": "list", "data": data})

    async def _model(self, send: Send, model: str) -> None:
        # Model ids may contain '/', as in OpenAI's fine-tune names.
        if model in self._ready_models():
            await respond(send, 200, msgspec.json.encode(_model_doc(model)))
            return
        await ProxyError(
            404,
            f"model '{model}' is not served by this grid right now; see GET /v1/models",
            "model_not_found",
        ).answer(send)

    # --- POST: the four steps ------------------------------------------------------------------
    async def handle(self, ex: Exchange) -> None:
        """Parse, resolve, relay and observe one POST; the single error path lives here."""
        try:
            try:
                await self.parse(ex)
            except ProxyError as err:
                await self._refuse(ex, err)
                return
            # From here on the body has been read: a disconnect can only mean the caller left.
            await self._resolve_and_relay(ex)
        except OSError:
            # The caller's connection broke while Grid was writing to it.
            ex.gone = True
            ex.breaker = "client_error"
            ex.outcome = "client_error"
        finally:
            self.observe(ex)

    async def _resolve_and_relay(self, ex: Exchange) -> None:
        """Steps 2 and 3, cancelled as soon as the caller disconnects.

        The watcher is a bare event-loop task rather than an anyio task group: measured on
        the fake-engine bench at 32 clients, the task group's cancel scopes cost about
        200 us of CPU per request and a third of the throughput. The watcher needs no
        cancelling on success: once the response is complete the server answers its
        ``receive()`` with ``http.disconnect`` at once (ASGI) and it ends by itself.
        """
        me = asyncio.current_task()
        assert me is not None
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(ex, me))
        try:
            await self._send_once(ex)
        except ProxyError as err:
            await self._refuse(ex, err)
        except asyncio.CancelledError:
            if not ex.gone:
                raise  # not the caller leaving (server shutdown): keep cancelling
            # The caller hung up: unwinding closed the upstream request, which is what
            # stops the engine generating.
            me.uncancel()
        finally:
            if not ex.completed and not watcher.done():
                watcher.cancel()
        if ex.gone:
            ex.breaker = "client_error"
            ex.outcome = "client_error"

    async def _send_once(self, ex: Exchange) -> None:
        """Resolve and relay; a request that provably reached no engine tries another one.

        Only a connection that failed before any byte was written is retried (at most
        :data:`MAX_UNSENT_ATTEMPTS` engines, each tried once); a POST that may have reached
        an engine is never resent (specification, "Global placement loop": the breaker
        steers later requests, Grid does not replay).

        Raises:
            ProxyError: as :meth:`resolve` and :func:`relay`; 503 + Retry-After
                ``upstream_unreachable`` when every engine tried refused the connection.
        """
        tried: set[str] = set()
        while True:
            try:
                await self.resolve(ex, exclude=tried)
            except ProxyError as err:
                if tried and err.code == "model_not_ready":
                    raise self._unreachable(ex, len(tried)) from None
                raise
            route = ex.route
            assert route is not None
            try:
                await relay(self.ctx, ex)
                return
            except NothingSent as why:
                tried.add(route.engine.record_id)
                self.ctx.router.finish(route, "failure", time.monotonic(), time.time())
                ex.began = False
                ex.route = None
                log.info(
                    "engine %s for %s refused the connection (%s) before anything was sent; "
                    "trying another ready replica",
                    route.engine.record_id,
                    route.model_id,
                    why,
                )
                if len(tried) >= MAX_UNSENT_ATTEMPTS:
                    raise self._unreachable(ex, len(tried)) from None

    def _unreachable(self, ex: Exchange, tried: int) -> ProxyError:
        return ProxyError(
            503,
            f"no engine of '{ex.served}' accepted a connection ({tried} tried; nothing was "
            "sent); retry after the advised delay",
            "upstream_unreachable",
            outcome="unavailable",
            retry_after_s=self.ctx.runner.retry_after_s(ex.served, time.time()),
        )

    async def _refuse(self, ex: Exchange, err: ProxyError) -> None:
        """Answer ``err`` unless the response already started (then only record it)."""
        ex.outcome = err.outcome
        if not ex.started:
            ex.status = err.status
            ex.started = ex.completed = True
            await err.answer(ex.send)

    async def parse(self, ex: Exchange) -> None:
        """Step 1: body, model, affinity key, shape, and the model for ``auto``.

        Raises:
            ProxyError: 413 oversized body; 400 non-JSON body, missing model or missing input
                field (:data:`REQUIRED_FIELDS`, with ``param``).
        """
        try:
            body = await read_body(ex.scope, ex.receive)
        except BodyTooLarge:
            raise ProxyError(
                413,
                f"request body exceeds {MAX_BODY_BYTES} bytes; send a smaller request",
                "request_too_large",
            ) from None
        try:
            check_json_depth(body, "request body")
            doc = msgspec.json.decode(body)
        except msgspec.DecodeError:
            raise ProxyError(400, "request body is not valid JSON", "invalid_json") from None
        except WireError as exc:  # nested deeper than MAX_JSON_DEPTH
            raise ProxyError(400, str(exc), "invalid_json") from None
        model = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(model, str) or not model:
            raise ProxyError(
                400, "request needs a string 'model' field", "missing_model", param="model"
            )
        required = REQUIRED_FIELDS.get(ex.endpoint)
        if required is not None and doc.get(required) in (None, "", []):
            raise ProxyError(
                400,
                f"{ex.path} needs a non-empty '{required}' field",
                "missing_required_parameter",
                param=required,
            )
        ex.body = body
        ex.requested = model
        operator: str | None = None
        for name, value in ex.scope["headers"]:
            if name == b"x-grid-affinity-key":
                ex.affinity_hash = routing.hash_affinity_key(value.decode("utf-8", "replace"))
            elif name == EVALUATION_HEADER:
                ex.evaluation = True
            elif name == OPERATOR_HEADER_RAW:
                operator = value.decode("utf-8", "replace")
        if ex.evaluation:
            self._check_evaluation_mark(operator)
        ex.shape = telemetry.shape_of(ex.endpoint, doc)
        ex.served = model
        if model == AUTO_MODEL:
            ex.workload = self._classify(ex.endpoint, ex.shape)
            ex.served = self._auto_model(ex.workload)
            if ex.served is not None:
                doc["model"] = ex.served
                ex.body = msgspec.json.encode(doc)

    def _check_evaluation_mark(self, operator: str | None) -> None:
        """Only the operator may mark inference as an evaluation (it then counts as no
        demand), so an ordinary caller can never suppress its own demand signal.

        Raises:
            ProxyError: 403 without the exact operator capability in X-Grid-Allocator-Token.
        """
        try:
            self.ctx.credentials.check_operator(operator)
        except AuthError:
            msg = (
                "X-Grid-Evaluation marks a request as an evaluation (never demand) and needs "
                f"the operator capability in {OPERATOR_HEADER}; drop the header to send an "
                "ordinary request"
            )
            raise ProxyError(403, msg, "evaluation_not_authorized") from None

    async def resolve(self, ex: Exchange, exclude: set[str] | frozenset[str] = frozenset()) -> None:
        """Step 2: one ready engine below its admission limit.

        When every ready engine is saturated the request waits up to
        :data:`ADMISSION_WAIT_S` for a slot (at most :data:`MAX_WAITING_PER_MODEL` waiters).
        ``exclude`` names engine records this request already failed to connect to.

        Raises:
            ProxyError: 404 for a model this grid does not know, 503 + ``Retry-After`` when
                no engine is ready or every ready engine stays saturated.
        """
        served = ex.served
        if served is None:
            raise self._no_route(ex, saturated=False)
        router = self.ctx.router
        route, saturated = self._pick(ex, served, exclude)
        if route is None and saturated and router.waiting(served) < MAX_WAITING_PER_MODEL:
            deadline = time.monotonic() + ADMISSION_WAIT_S
            while route is None and saturated:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await router.wait_for_slot(served, left)
                route, saturated = self._pick(ex, served, exclude)
        if route is None:
            raise self._no_route(ex, saturated=saturated)
        ex.route = route

    def _no_route(self, ex: Exchange, *, saturated: bool) -> ProxyError:
        served = ex.served
        known = served is not None and (
            served in self.ctx.runner.profile_ids or served in self.ctx.router.routed_models()
        )
        if ex.requested != AUTO_MODEL and not known:
            return ProxyError(
                404,
                f"model '{ex.requested}' is not served by this grid; see GET /v1/models",
                "model_not_found",
            )
        if saturated:
            return ProxyError(
                503,
                f"every engine of model '{served}' is busy; retry after the advised delay",
                "model_saturated",
                outcome="rejected",
                retry_after_s=self.ctx.router.busy_retry_after_s(served or "", time.time()),
            )
        why = self.ctx.runner.unplaceable(served)
        left = self.ctx.runner.registration_left_s() if why is not None else 0.0
        if why is not None and left > 0:
            # Hosts are still registering after a (re)start: the capable one may be next.
            return ProxyError(
                503,
                f"model '{ex.requested}' has no ready engine right now: no host registered so "
                f"far can run it ({why}); hosts are still registering after the server started "
                f"(this is final in {math.ceil(left)} s); retry after the advised delay",
                "model_not_ready",
                outcome="unavailable",
                retry_after_s=self.ctx.runner.retry_after_s(served, time.time()),
            )
        if why is not None:
            # Waiting will not help: say so, and why. Retry-After is the longest cold-start
            # advice so that a client that retries anyway does not hammer the grid.
            return ProxyError(
                503,
                f"model '{served}' cannot be placed on any host: {why}; an operator must change "
                f"its profile or the fleet (grid allocator explain {served})",
                "model_unplaceable",
                outcome="unavailable",
                retry_after_s=routing.MAX_COLD_RETRY_AFTER_S,
            )
        return ProxyError(
            503,
            f"model '{ex.requested}' has no ready engine right now; retry after the advised delay",
            "model_not_ready",
            outcome="unavailable",
            retry_after_s=self.ctx.runner.retry_after_s(served, time.time()),
        )

    def _pick(
        self, ex: Exchange, model: str, exclude: set[str] | frozenset[str] = frozenset()
    ) -> tuple[Route | None, bool]:
        """(route, saturated): the chosen engine, or ``None`` and whether any was eligible."""
        router = self.ctx.router
        routes = router.routes(model)
        if exclude:
            routes = [r for r in routes if r.engine.record_id not in exclude]
        if not routes:
            return None, False
        now = time.time()
        cands = router.candidates(routes, now, time.monotonic())
        profile = self.ctx.runner.profiles.get(model)
        sha = profile.artifact_sha256 if profile is not None else None
        if sha is not None:
            # During a revision rollout both digests may be routable: an eligible engine of
            # the configured revision wins; the old one serves only while none is ready.
            current = {r.engine.record_id for r in routes if r.artifact == sha}
            preferred = [c for c in cands if c.engine_id in current]
            if any(routing.eligible(c) for c in preferred):
                cands = preferred
        chosen = routing.choose_route(
            cands, now, max_tokens=ex.shape.max_tokens, affinity_hash=ex.affinity_hash
        )
        if chosen is None:
            return None, any(routing.eligible(c) for c in cands)
        return next(r for r in routes if r.engine.record_id == chosen), False

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
        """The model for an ``auto`` request: the allocator's portfolio choice for
        ``workload`` when it is ready, else the ready model with the best configured score.

        Among ready models with equal scores (an unclassified request, or a workload no ready
        model is scored for), a baseline (``min_replicas`` or pins: the fleet's always-on
        service) comes first, then the higher priority, then the model id, so the answer does
        not depend on which optional specialist happens to sort first."""
        ready = self._ready_models()
        if not ready:
            return None
        chosen = self.ctx.runner.portfolio_choice(workload)
        if chosen is not None and chosen in ready:
            return chosen
        profiles = self.ctx.runner.profiles

        def rank(m: str) -> tuple[float, bool, int, str]:
            p = profiles.get(m)
            if p is None:
                return (0.0, True, 0, m)
            s = p.workload_scores.get(workload, 0.0) if workload else 0.0
            baseline = p.min_replicas > 0 or bool(p.pins)
            return (-s, not baseline, -p.priority, m)

        return min(ready, key=rank)

    def observe(self, ex: Exchange) -> None:
        """Step 4: breaker, in-flight count, measurements and demand, once per request.

        Never raises: observation is best effort and must not fail a response.
        """
        if not ex.requested:
            return  # refused before a model was named: nothing to attribute
        now = time.time()
        route = ex.route
        if route is not None and ex.began:
            service_s = ex.service_s if ex.service_s is not None else 0.0
            ok = ex.breaker == "success"
            try:
                self.ctx.router.finish(
                    route,
                    ex.breaker,
                    time.monotonic(),
                    now,
                    service_s * 1000.0 if ok else None,
                    ex.tokens if ok else None,
                    service_s,
                )
            except Exception:  # observation never fails a response
                log.exception("router bookkeeping failed")
        try:
            retry = self._is_retry(ex)
            self.ctx.runner.observe(
                telemetry.features(
                    at=now,
                    endpoint=ex.endpoint,
                    requested_model=ex.requested or "",
                    served_model=route.model_id if route is not None else None,
                    shape=ex.shape,
                    output_units=ex.tokens,
                    workload=ex.workload,
                    service_time_s=ex.service_s if route is not None else None,
                    queue_s=ex.queue_s if route is not None else time.perf_counter() - ex.t0,
                    outcome=ex.outcome,
                    affinity_hash=ex.affinity_hash,
                    retry=retry,
                    evaluation=ex.evaluation,
                )
            )
        except Exception:  # observation is best effort
            log.exception("request observation failed")

    def _is_retry(self, ex: Exchange) -> bool:
        """Whether this request repeats one already counted as demand after a 503."""
        ledger = self.retries
        refused = ex.status == 503 and ex.route is None
        if not refused and not (ex.outcome == "ok" and len(ledger)):
            return False
        client = ex.scope.get("client")
        identity = ledger.identity(client[0] if client else "", ex.affinity_hash, ex.body)
        mono = time.monotonic()
        return ledger.refused(identity, mono) if refused else ledger.served(identity, mono)


async def _watch_disconnect(ex: Exchange, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` when the caller disconnects before its response is complete."""
    while (await ex.receive())["type"] != "http.disconnect":
        pass
    if not ex.completed:
        ex.gone = True
        task.cancel()


def _model_doc(model: str) -> dict[str, object]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "grid"}


def retry_after_header(seconds: float) -> int:
    """A ``Retry-After`` value: whole seconds, at least one."""
    return max(1, math.ceil(seconds))
