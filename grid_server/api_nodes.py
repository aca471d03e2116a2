"""``/nodes`` routes: registration, heartbeats with command delivery, removal, discovery.

Source: the specification's "Local wire contract" and "HTTP control surface". Every route
except ``GET /nodes`` needs the host-scoped node credential in ``X-Grid-Allocator-Node-Token``.
"""

from __future__ import annotations

import time
from typing import TypeVar

from litestar import Request, Response, delete, get, post, put
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery

from grid_core.hosts import LEASE_TTL_S
from grid_core.wire import (
    AllocatorResponse,
    Decoded,
    Heartbeat,
    HeartbeatResponse,
    NodeRegistration,
    WireError,
    decode,
    encode,
)
from grid_server.context import ServerContext
from grid_server.guards import node_claims, node_guard
from grid_server.http import MAX_NODE_BODY_BYTES, json_response
from grid_server.registry import refuse_route_to_server, safety_facts

T = TypeVar("T")


def node_routes(ctx: ServerContext) -> list[HTTPRouteHandler]:
    """The ``/nodes`` handlers bound to ``ctx``.

    Credentialed routes carry the node guard (it verifies the host-scoped credential before
    the body is read) and the :data:`MAX_NODE_BODY_BYTES` cap. Bodies are decoded by
    :func:`grid_core.wire.decode`, not by the framework: a malformed residency row is dropped
    and reported, and an invalid document fails the host closed (specification, "Local wire
    contract") — behaviour a plain typed ``data`` cannot express.
    """
    node = [node_guard(ctx.credentials)]
    limit = MAX_NODE_BODY_BYTES

    @put("/nodes/{node_id:str}", status_code=200, guards=node, request_max_body_size=limit)
    async def register(request: Request, node_id: FromPath[str]) -> Response:
        """Register or refresh a record (control or engine) of the authenticated host."""
        claims = node_claims(request)
        doc = await decoded(ctx, request, claims.host_id, node_id, NodeRegistration)
        if doc.document.role == "engine" and doc.document.url:
            refuse_route_to_server(doc.document.url, ctx.url)
        now = time.time()
        before = safety_facts(ctx.registry.records.get(node_id))
        dropped = ctx.registry.dropped_routes
        rec = ctx.registry.register(claims.host_id, node_id, doc, now, issued_at=claims.issued_at)
        changed = safety_facts(rec) != before or ctx.registry.dropped_routes != dropped
        ctx.runner.input_changed(now, safety_changed=changed)
        return json_response(
            {
                "node_id": rec.record_id,
                "host_id": rec.host_id,
                "role": rec.role,
                "ttl_seconds": LEASE_TTL_S,
                "rejected_rows": list(rec.rejected_rows),
            }
        )

    @post(
        "/nodes/{node_id:str}/heartbeat", status_code=200, guards=node, request_max_body_size=limit
    )
    async def heartbeat(request: Request, node_id: FromPath[str]) -> Response:
        """Refresh a lease; deliver commands when asked (control records only)."""
        claims = node_claims(request)
        doc = await decoded(ctx, request, claims.host_id, node_id, Heartbeat)
        now = time.time()
        before = safety_facts(ctx.registry.records.get(node_id))
        rec = ctx.registry.heartbeat(claims.host_id, node_id, doc, now, issued_at=claims.issued_at)
        hb = doc.document
        ctx.runner.acknowledge(claims.host_id, hb.acknowledgements)
        ctx.runner.input_changed(now, safety_changed=safety_facts(rec) != before)
        body = HeartbeatResponse(
            ttl_seconds=LEASE_TTL_S,
            model_last_used_at=ctx.router.model_last_used(claims.host_id),
            allocator=await allocator_answer(
                ctx, claims.host_id, hb.request_commands and rec.role == "allocator"
            ),
            engine_key_required=True,
        )
        return Response(content=encode(body), media_type="application/json")

    @delete("/nodes/{node_id:str}", status_code=200, guards=node, request_max_body_size=limit)
    async def remove(
        request: Request, node_id: FromPath[str], instance: FromQuery[str | None] = None
    ) -> Response:
        """Remove a record the authenticated host owns (``?instance=`` names the sending
        agent run; a run that no longer holds the host id is refused with 409)."""
        claims = node_claims(request)
        now = time.time()
        ctx.registry.remove(claims.host_id, node_id, instance, now, issued_at=claims.issued_at)
        ctx.runner.input_changed(now, safety_changed=True)  # membership changed
        return json_response({"removed": node_id})

    @get("/nodes")
    async def nodes() -> Response:
        """Public discovery: records without keys or private measurements."""
        return json_response({"nodes": ctx.registry.public(time.time())})

    return [register, heartbeat, remove, nodes]


async def decoded(
    ctx: ServerContext, request: Request, host_id: str, node_id: str, kind: type[T]
) -> Decoded[T]:
    """The request body decoded as ``kind`` by :func:`grid_core.wire.decode`.

    Raises:
        WireError: the document is invalid; a known host's record is then marked invalid
            first, so it fails closed at once instead of leaving its last (possibly
            accepting) report in force.
    """
    body = await request.body()
    try:
        return decode(body, kind)
    except WireError as exc:
        if ctx.registry.mark_invalid(host_id, node_id, str(exc)):
            ctx.runner.input_changed(time.time(), safety_changed=True)
        raise


async def allocator_answer(ctx: ServerContext, host_id: str, deliver: bool) -> AllocatorResponse:
    """The allocator part of a heartbeat answer: with ``deliver`` (a control record asked for
    commands) the delivery step runs and its commands go out; otherwise (an early lease or
    fence heartbeat) only the mode, and nothing is marked delivered."""
    follower = ctx.runner.follower is not None
    if not deliver:
        return AllocatorResponse(mode=ctx.runner.mode(), follower=follower)
    d = await ctx.runner.deliver(host_id)
    return AllocatorResponse(
        mode=d.mode,
        controller_lease_ttl_seconds=d.lease_ttl_s,
        commands=list(d.commands),
        follower=follower,
    )
