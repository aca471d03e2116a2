"""Step 3 of the proxy: one upstream POST, its answer classified and relayed.

The engine's answer is classified by :func:`grid_core.routing.classify_upstream`:
caller-caused answers (context too long, a bad parameter, an endpoint the engine does not
offer) reach the caller as a 4xx and never penalise the engine's breaker; engine-caused ones
(transport errors, other 5xx, a refused private key) do. Bodies are relayed byte for byte
and scanned only for the completion-token count.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import aiohttp
import msgspec

from grid_core import routing
from grid_core.demand.features import Outcome
from grid_server.sse import MAX_JSON_BODY_BYTES, UsageScanner, usage_from_json
from grid_server.upstream import NOTHING_SENT, UpstreamError

if TYPE_CHECKING:
    from grid_server.context import ServerContext
    from grid_server.proxy import Exchange

MAX_ERROR_BODY_BYTES = 64 * 1024
"""Largest engine error body read for classification; an error document is a few hundred
bytes, anything bigger is not an error document we can attribute."""
MAX_ENGINE_MESSAGE_CHARS = 300
"""Longest engine error message passed on in Grid's rewritten answers."""
FORWARD_RESPONSE_HEADERS = frozenset({"content-type", "cache-control", "content-length"})
"""Response headers passed back to the caller; the body is relayed byte for byte, so its
length stays true (the upstream hop asks for identity encoding)."""

FEATURE_OUTCOME: dict[routing.BreakerOutcome, Outcome] = {
    "success": "ok",
    "rate_limited": "rejected",
    "client_error": "client_error",
    "failure": "error",
}
"""Breaker outcome → demand outcome (caller-caused answers are never demand evidence)."""
SERVER_TIMING = b"server-timing"
"""Response header reporting how long the engine took to answer (W3C Server-Timing), as
``upstream;dur=<ms>``: from Grid sending the request upstream to the engine's response head.
A caller (and ``grid bench proxy``) subtracts it from its own latency to see what Grid added
for that very request; it reveals nothing the caller's own clock does not roughly show."""


class _ErrorDoc(msgspec.Struct):
    message: str | None = None
    type: str | None = None


class _ErrorBody(msgspec.Struct):
    error: _ErrorDoc | str | None = None


_error_decoder = msgspec.json.Decoder(_ErrorBody)


def error_fields(raw: bytes) -> tuple[str | None, str | None]:
    """(``error.type``, ``error.message``) of an OpenAI-shaped error body, if it is one."""
    try:
        doc = _error_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None, None
    if isinstance(doc.error, str):
        return None, doc.error
    if doc.error is None:
        return None, None
    return doc.error.type, doc.error.message


class NothingSent(Exception):
    """The upstream connection failed before any byte of the request was written.

    Connecting was refused, reset or timed out (or no pooled connection was granted), so the
    engine provably never saw the request: the proxy may send it to another ready replica.
    """


ENGINE_LOST_RETRY_AFTER_S = 2
"""Retry-After (seconds) when the engine serving a request stopped before answering: the
router steers the next attempt to another replica at once, a replacement needs longer."""


async def relay(ctx: ServerContext, ex: Exchange) -> None:
    """Send ``ex`` to its resolved engine and relay the answer to the caller.

    Raises:
        NothingSent: connecting failed before any byte was written (safe to send elsewhere).
        ProxyError: 503 + Retry-After when the engine failed after the request may have
            reached it but before answering (never replayed: it may have been processed);
            502 when it fails mid-response and for answers Grid rewrites (caller-caused
            5xx/501 as 400, a refused key as 502).
    """
    from grid_server.proxy import ProxyError

    route = ex.route
    assert route is not None
    eng = route.engine
    headers = {
        "content-type": "application/json",
        # identity: the body is relayed raw and scanned for usage.
        "accept-encoding": "identity",
        "accept": "text/event-stream" if ex.shape.stream else "application/json",
    }
    if ex.shape.stream:
        # llama-server may announce keep-alive on a stream and close anyway; a connection
        # that might be closed under us is never reused (see grid_server.upstream).
        headers["connection"] = "close"
    key = ctx.registry.engine_key(eng.record_id)
    if key:
        headers["authorization"] = f"Bearer {key}"
    ctx.router.begin(route, time.monotonic())
    ex.began = True
    ex.queue_s = time.perf_counter() - ex.t0
    t_up = time.perf_counter()
    try:
        verify = ctx.registry.engine_ssl(eng.record_id)
        async with ctx.client.post(f"{eng.url}{ex.path}", ex.body, headers, verify) as up:
            timing = b"upstream;dur=%.3f" % ((time.perf_counter() - t_up) * 1000.0)
            if 200 <= up.status < 300:
                await _relay_success(ex, up, timing)
            else:
                await _relay_error(ex, up, timing)
    except NOTHING_SENT as exc:
        ex.breaker = "failure"
        raise NothingSent(type(exc).__name__) from None
    except UpstreamError as exc:
        ex.breaker = "failure"
        if not ex.started:
            # The request may have reached the engine (it died or hung up after the write):
            # never resent by Grid, but the caller may retry and the router steers it away.
            raise ProxyError(
                503,
                f"the engine serving '{route.model_id}' stopped before answering "
                f"({type(exc).__name__}); Grid did not resend the request because the engine "
                "may have processed it; retry after the advised delay",
                "engine_lost",
                retry_after_s=ENGINE_LOST_RETRY_AFTER_S,
            ) from None
        raise ProxyError(
            502,
            f"engine for '{route.model_id}' failed mid-response ({type(exc).__name__}); "
            "the request was not retried",
            "upstream_error",
        ) from None
    finally:
        ex.service_s = time.perf_counter() - t_up


def _forwarded(up: aiohttp.ClientResponse, timing: bytes) -> list[tuple[bytes, bytes]]:
    headers = [
        (k.lower(), v)
        for k, v in up.raw_headers
        if k.lower().decode("latin-1") in FORWARD_RESPONSE_HEADERS
    ]
    headers.append((SERVER_TIMING, timing))
    return headers


async def _relay_success(ex: Exchange, up: aiohttp.ClientResponse, timing: bytes) -> None:
    await ex.start(up.status, _forwarded(up, timing))
    if "text/event-stream" in up.headers.get("content-type", ""):
        scanner = UsageScanner()
        async for chunk in up.content.iter_any():
            scanner.feed(chunk)
            await ex.body_chunk(chunk)
        tokens = scanner.completion_tokens
    else:
        whole: list[bytes] = []
        size = 0
        async for chunk in up.content.iter_any():
            if size <= MAX_JSON_BODY_BYTES:
                whole.append(chunk)
                size += len(chunk)
            await ex.body_chunk(chunk)
        tokens = usage_from_json(b"".join(whole))[0] if whole else None
    await ex.finish()
    # Only a response relayed to its end is a success (breaker, measurements, demand).
    ex.breaker = "success"
    ex.outcome = "ok"
    ex.tokens = tokens


async def _relay_error(ex: Exchange, up: aiohttp.ClientResponse, timing: bytes) -> None:
    from grid_server.proxy import ProxyError

    route = ex.route
    assert route is not None
    raw = bytearray()
    async for chunk in up.content.iter_any():
        raw += chunk
        if len(raw) > MAX_ERROR_BODY_BYTES:
            ex.breaker = "failure"
            raise ProxyError(
                502,
                f"engine for '{route.model_id}' answered {up.status} with an oversized body",
                "upstream_error",
            )
    kind, message = error_fields(bytes(raw))
    verdict = routing.classify_upstream(up.status, kind, message)
    ex.breaker = verdict.breaker
    outcome = FEATURE_OUTCOME[verdict.breaker]
    if verdict.code is None:
        ex.outcome = outcome
        await ex.start(up.status, _forwarded(up, timing))
        if raw:
            await ex.body_chunk(bytes(raw))
        await ex.finish()
        return
    if verdict.code == "upstream_auth":
        # Its body is not forwarded: it could echo credentials.
        text = f"engine for '{route.model_id}' refused Grid's credential"
    elif verdict.code == "unsupported_endpoint":
        text = f"model '{route.model_id}' does not offer {ex.path}"
    else:
        text = (message or f"engine answered {up.status}")[:MAX_ENGINE_MESSAGE_CHARS]
    raise ProxyError(verdict.status, text, verdict.code, outcome=outcome)
