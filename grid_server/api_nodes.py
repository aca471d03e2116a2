"""``/nodes`` routes: registration, heartbeats with command delivery, removal, discovery.

Source: the specification's "Local wire contract" and "HTTP control surface". Every route
except ``GET /nodes`` needs the host-scoped node credential in ``X-Grid-Allocator-Node-Token``.
"""

from __future__ import annotations

import time
from typing import TypeVar

from litestar import Request, Response, delete, get, post, put
from litestar.handlers import HTTPRouteHandler

from grid_core.hosts import LEASE_TTL_S
from grid_core.wire import (
    CONTROL_HEADER,
    AllocatorResponse,
    Decoded,
    Heartbeat,
    HeartbeatResponse,
    NodeRegistration,
    WireError,
    decode,
    encode,
)
from grid_server.auth import NodeClaims
from grid_server.context import ServerContext
from grid_server.http import json_response, read_limited

T = TypeVar("T")

MAX_NODE_BODY_BYTES = 1024 * 1024
"""A registration or heartbeat with 256 residencies is ~100 KiB; 1 MiB leaves headroom."""


def node_routes(ctx: ServerContext) -> list[HTTPRouteHandler]:
    """The ``/nodes`` handlers bound to ``ctx``."""

    def claims_of(request: Request) -> NodeClaims:
        return ctx.credentials.verify_node(request.headers.get(CONTROL_HEADER), time.time())

    async def decoded(request: Request, host_id: str, node_id: str, kind: type[T]) -> Decoded[T]:
        body = await read_limited(request, MAX_NODE_BODY_BYTES)
        try:
            return decode(body, kind)
        except WireError as exc:
            # An invalid lifecycle or document from a known host fails closed at once
            # instead of leaving its last (possibly accepting) report in force.
            if ctx.registry.mark_invalid(host_id, node_id, str(exc)):
                ctx.runner.input_changed(time.time(), safety_changed=True)
            raise

    @put("/nodes/{node_id:str}", status_code=200)
    async def register(request: Request, node_id: str) -> Response:
        """Register or refresh a record (control or engine) of the authenticated host."""
        claims = claims_of(request)
        doc = await decoded(request, claims.host_id, node_id, NodeRegistration)
        now = time.time()
        rec = ctx.registry.register(claims.host_id, node_id, doc, now)
        ctx.runner.input_changed(now)
        return json_response(
            {
                "node_id": rec.record_id,
                "host_id": rec.host_id,
                "role": rec.role,
                "ttl_seconds": LEASE_TTL_S,
                "rejected_rows": list(rec.rejected_rows),
            }
        )

    @post("/nodes/{node_id:str}/heartbeat", status_code=200)
    async def heartbeat(request: Request, node_id: str) -> Response:
        """Refresh a lease; deliver commands when asked (control records only)."""
        claims = claims_of(request)
        doc = await decoded(request, claims.host_id, node_id, Heartbeat)
        now = time.time()
        rec = ctx.registry.heartbeat(claims.host_id, node_id, doc, now)
        hb = doc.document
        ctx.runner.acknowledge(claims.host_id, hb.acknowledgements)
        ctx.runner.input_changed(now)
        if hb.request_commands and rec.role == "allocator":
            d = await ctx.runner.deliver(claims.host_id)
            allocator = AllocatorResponse(
                mode=d.mode, controller_lease_ttl_seconds=d.lease_ttl_s, commands=list(d.commands)
            )
        else:
            # Early lease/fence heartbeat: registry truth only, nothing marked delivered.
            allocator = AllocatorResponse(mode=ctx.runner.mode())
        body = HeartbeatResponse(
            ttl_seconds=LEASE_TTL_S,
            model_last_used_at=ctx.router.model_last_used(claims.host_id),
            allocator=allocator,
            engine_key_required=True,
        )
        return Response(content=encode(body), media_type="application/json")

    @delete("/nodes/{node_id:str}", status_code=200)
    async def remove(request: Request, node_id: str) -> Response:
        """Remove a record the authenticated host owns."""
        claims = claims_of(request)
        ctx.registry.remove(claims.host_id, node_id)
        now = time.time()
        ctx.runner.input_changed(now)
        return json_response({"removed": node_id})

    @get("/nodes")
    async def nodes() -> Response:
        """Public discovery: records without keys or private measurements."""
        return json_response({"nodes": ctx.registry.public(time.time())})

    return [register, heartbeat, remove, nodes]
