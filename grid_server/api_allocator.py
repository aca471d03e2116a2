"""``/allocator`` routes: status, profiles, mode, tick, evaluations and node credentials.

Source: the specification's "HTTP control surface". Every mutation needs the operator
capability (``X-Grid-Allocator-Token`` or ``Authorization: Bearer``); status is read-only.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post, put
from litestar.handlers import HTTPRouteHandler

from grid_core.errors import NotFoundError, ValidationError
from grid_core.profile import WORKLOAD_NAME, profile_from_json
from grid_core.wire import OPERATOR_HEADER
from grid_server.auth import MAX_NODE_CREDENTIAL_TTL_S, NODE_CREDENTIAL_TTL_S, bearer, new_host_id
from grid_server.context import ServerContext
from grid_server.http import decode_object, json_response, read_limited

MAX_CONTROL_BODY_BYTES = 256 * 1024
"""A profile or mode change is a few hundred bytes; 256 KiB is generous."""
MODES = ("observe", "recommend", "automatic")
HOST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
"""Host ids: simple, log-safe names (they appear in record ids and status)."""


def _operator(ctx: ServerContext, request: Request) -> None:
    token = request.headers.get(OPERATOR_HEADER) or bearer(request.headers.get("authorization"))
    ctx.credentials.check_operator(token)


def token_routes(ctx: ServerContext) -> list[HTTPRouteHandler]:
    """``POST /allocator/tokens`` bound to ``ctx``."""

    @post("/allocator/tokens", status_code=200)
    async def tokens(request: Request) -> Response:
        """Issue an expiring node credential scoped to one host id (operator only)."""
        _operator(ctx, request)
        doc = decode_object(await read_limited(request, MAX_CONTROL_BODY_BYTES), "token")
        host_id = doc.get("host_id") or new_host_id()
        ttl = doc.get("ttl_s", NODE_CREDENTIAL_TTL_S)
        if not isinstance(host_id, str) or not HOST_ID.match(host_id):
            msg = "token: host_id must be 1-128 characters of letters, digits, '.', '_', '-'"
            raise ValidationError(msg)
        if (
            not isinstance(ttl, int | float)
            or isinstance(ttl, bool)
            or not math.isfinite(ttl)
            or not 0 < ttl <= MAX_NODE_CREDENTIAL_TTL_S
        ):
            msg = f"token: ttl_s must be in (0, {MAX_NODE_CREDENTIAL_TTL_S:.0f}] seconds"
            raise ValidationError(msg)
        now = time.time()
        token = ctx.credentials.issue_node(host_id, now, float(ttl))
        return json_response({"host_id": host_id, "token": token, "expires_at": now + float(ttl)})

    return [tokens]


def allocator_routes(ctx: ServerContext) -> list[HTTPRouteHandler]:
    """The ``/allocator`` handlers bound to ``ctx``."""

    def operator(request: Request) -> None:
        _operator(ctx, request)

    @get("/allocator/status")
    async def status(request: Request) -> Response:
        """Controller status plus the server's own view (no secrets)."""
        q = request.query_params
        detail = any(k in q for k in ("detail", "json")) and q.get("detail", "1") not in ("0",)
        return json_response(await status_document(ctx, detail))

    @put("/allocator/models/{model_id:str}", status_code=200)
    async def put_model(request: Request, model_id: str) -> Response:
        """Create or replace a model profile (validated whole, or rejected whole)."""
        operator(request)
        doc = decode_object(await read_limited(request, MAX_CONTROL_BODY_BYTES), "model profile")
        if doc.setdefault("model_id", model_id) != model_id:
            msg = f"model profile: model_id '{doc['model_id']}' does not match the path"
            raise ValidationError(msg)
        profile = profile_from_json(doc)
        await ctx.runner.put_profile(profile)
        return json_response({"model_id": model_id, "profile": profile})

    @get("/allocator/models/{model_id:str}")
    async def get_model(model_id: str) -> Response:
        """One model's current profile (public, like status), or 404 when it has none."""
        profile = ctx.runner.profiles.get(model_id)
        if profile is None:
            msg = f"model '{model_id}' has no profile; see 'grid allocator status'"
            raise NotFoundError(msg)
        return json_response({"model_id": model_id, "profile": profile})

    @delete("/allocator/models/{model_id:str}", status_code=200)
    async def delete_model(request: Request, model_id: str) -> Response:
        """Retire a profile; the controller converges it to zero replicas safely."""
        operator(request)
        if model_id not in ctx.runner.profile_ids:
            msg = f"model '{model_id}' has no profile; see 'grid allocator status'"
            raise NotFoundError(msg)
        await ctx.runner.remove_profile(model_id)
        return json_response({"model_id": model_id, "removed": True})

    @put("/allocator/mode", status_code=200)
    async def put_mode(request: Request) -> Response:
        """Select observe, recommend or automatic."""
        operator(request)
        doc = decode_object(await read_limited(request, MAX_CONTROL_BODY_BYTES), "mode")
        mode = doc.get("mode")
        if mode not in MODES:
            msg = f"mode: {mode!r} is not one of {', '.join(MODES)}"
            raise ValidationError(msg)
        await ctx.runner.set_mode(str(mode))
        return json_response({"mode": ctx.runner.mode()})

    @post("/allocator/tick", status_code=200)
    async def tick(request: Request) -> Response:
        """Run one reconciliation pass now and return its result."""
        operator(request)
        result = await ctx.runner.tick()
        return json_response({"tick": msgspec.to_builtins(result) if result is not None else None})

    @post("/allocator/evaluations", status_code=200)
    async def evaluations(request: Request) -> Response:
        """Record labelled quality evidence for (model, workload, artifact revision)."""
        operator(request)
        doc = decode_object(await read_limited(request, MAX_CONTROL_BODY_BYTES), "evaluation")
        model_id, workload, score, sha = _evaluation_fields(doc)
        latency = doc.get("latency_ms")
        if latency is not None and (
            not isinstance(latency, int | float)
            or isinstance(latency, bool)
            or not math.isfinite(latency)
            or latency < 0
        ):
            raise ValidationError("evaluation: 'latency_ms' must be a non-negative number")
        now = ctx.runner.clock()
        # The controller owns the profile lookup (404) and the revision check (409).
        evidence = await ctx.runner.call(
            lambda: ctx.runner.ctl.record_evaluation(
                model_id,
                workload,
                sha,
                score,
                now,
                latency_ms=None if latency is None else float(latency),
            )
        )
        ctx.runner.poke()
        return json_response(
            {
                "model_id": model_id,
                "workload": workload,
                "score": score,
                "artifact_sha256": evidence.artifact_sha256,
                "recorded": True,
                "evidence": msgspec.to_builtins(evidence),
            }
        )

    return [
        status,
        get_model,
        put_model,
        delete_model,
        put_mode,
        tick,
        evaluations,
        *token_routes(ctx),
    ]


def _evaluation_fields(doc: dict[str, Any]) -> tuple[str, str, float, str | None]:
    model_id, workload, score = doc.get("model_id"), doc.get("workload"), doc.get("score")
    sha = doc.get("artifact_sha256")
    if not isinstance(model_id, str) or not model_id:
        raise ValidationError("evaluation: 'model_id' is required")
    if not isinstance(workload, str) or not WORKLOAD_NAME.match(workload):
        raise ValidationError("evaluation: 'workload' must be a simple lowercase name")
    if (
        not isinstance(score, int | float)
        or isinstance(score, bool)
        or not math.isfinite(score)
        or not 0.0 <= score <= 1.0
    ):
        raise ValidationError("evaluation: 'score' must be a number in [0, 1]")
    if sha is not None and (not isinstance(sha, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", sha)):
        raise ValidationError("evaluation: 'artifact_sha256' must be 64 hex digits")
    return model_id, workload, float(score), sha.lower() if sha else None


async def status_document(ctx: ServerContext, detail: bool) -> dict[str, Any]:
    """Everything status shows: the controller's data plus the server's (no secrets)."""
    now = time.time()
    try:
        controller = await ctx.runner.status(detail)
    except Exception as exc:  # status must stay readable even when the controller fails
        controller = {"error": f"{type(exc).__name__}: {exc}"}
    runner = ctx.runner
    return {
        "mode": runner.mode(),
        "controller": controller,
        "server": {
            "url": ctx.url,
            "ticks": runner.ticks,
            "last_tick_s": runner.last_tick_s,
            "last_error": runner.last_error,
            "dropped_features": runner.dropped_features,
            "warnings": list(ctx.warnings),
            "nodes": ctx.registry.public(now),
            "open_breakers": ctx.router.public_breakers(time.monotonic()),
            "inflight_requests": sum(ctx.router.inflight.values()),
            "profiles": sorted(runner.profile_ids),
        },
    }
