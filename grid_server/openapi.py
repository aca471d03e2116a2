"""The OpenAPI 3.1 document served at ``/schema`` (and ``/schema/openapi.json``).

Litestar generates the allocator, node and observation routes from their handlers. The
OpenAI-compatible ``/v1`` routes bypass Litestar (a lean ASGI proxy serves them), so they are
added here as described operations that point to the OpenAI API for their bodies: Grid relays
those bodies unchanged and only reads ``model``, ``stream`` and the token limits.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar, Request
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import (
    ExternalDocumentation,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    PathItem,
    Reference,
    RequestBody,
    Schema,
    Tag,
)

from grid_core.wire import Heartbeat, HeartbeatResponse, NodeRegistration

SCHEMA_PATH = "/schema"
OPENAI_TAG = "OpenAI-compatible"
OPENAI_DOCS = ExternalDocumentation(
    url="https://platform.openai.com/docs/api-reference",
    description="Request and response bodies follow the OpenAI API; Grid relays them unchanged.",
)
OPENAI_ROUTES: tuple[tuple[str, str, str], ...] = (
    ("/v1/chat/completions", "post", "Chat completion routed to one ready engine of `model`."),
    ("/v1/completions", "post", "Text completion routed to one ready engine of `model`."),
    ("/v1/embeddings", "post", "Embeddings routed to one ready engine of `model`."),
    ("/v1/models", "get", "Models that have at least one ready, admitted engine right now."),
)
"""Every route the proxy serves, as (path, method, summary)."""

TAGS = [
    Tag(name="allocator", description="Operator control surface: status, profiles, mode."),
    Tag(name="nodes", description="Node agents: registration, heartbeats, command delivery."),
    Tag(name="observation", description="Read-only metrics and the dashboard."),
    Tag(
        name=OPENAI_TAG,
        description="The OpenAI-compatible inference API.",
        external_docs=OPENAI_DOCS,
    ),
]


NODE_WIRE: tuple[tuple[str, str, type, type | None], ...] = (
    ("/nodes/{node_id}", "put", NodeRegistration, None),
    ("/nodes/{node_id}/heartbeat", "post", Heartbeat, HeartbeatResponse),
)
"""Node routes that decode their body with the wire codec (to fail a host closed on a bad
document) rather than through Litestar: (path, method, request type, response type)."""


class WireSchemaPlugin(JsonRenderPlugin):
    """JSON rendering that first adds the node wire documents' JSON Schemas to the document."""

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        """Render ``openapi_schema`` with the node bodies described (added once)."""
        add_node_wire(openapi_schema)
        return super().render(request, openapi_schema)


def add_node_wire(doc: dict[str, Any]) -> None:
    """Describe the node routes' request and response bodies with the wire types' schemas.

    Idempotent: Litestar caches the document, so the first rendering completes it for all.
    """
    types = [t for _p, _m, req, resp in NODE_WIRE for t in (req, resp) if t is not None]
    refs, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in components.items():
        schemas.setdefault(name, schema)
    ref = dict(zip(types, refs, strict=True))
    for path, method, req, resp in NODE_WIRE:
        op = doc.get("paths", {}).get(path, {}).get(method)
        if op is None:
            continue
        op["requestBody"] = {
            "required": True,
            "description": "A wire document (schema_version 1), see docs/wire.md.",
            "content": {"application/json": {"schema": ref[req]}},
        }
        if resp is not None:
            ok = op.setdefault("responses", {}).setdefault("200", {"description": "OK"})
            ok["content"] = {"application/json": {"schema": ref[resp]}}


def openapi_config(version: str) -> OpenAPIConfig:
    """Litestar's OpenAPI settings: JSON at ``/schema`` and ``/schema/openapi.json``.

    No HTML viewer is served: the usual viewers load their scripts from a CDN, which an
    intranet without internet access cannot reach.
    """
    return OpenAPIConfig(
        title="Grid",
        version=version,
        description=(
            "Placement, reconciliation, routing and host protection for an AI intranet. "
            "Mutations need the operator capability (X-Grid-Allocator-Token or "
            "Authorization: Bearer); node routes need the host's node credential."
        ),
        path=SCHEMA_PATH,
        tags=TAGS,
        use_handler_docstrings=True,
        render_plugins=[WireSchemaPlugin(path=["/openapi.json", "/"])],
    )


def _openai_operation(path: str, method: str, summary: str) -> Operation:
    body = None
    if method == "post":
        body = RequestBody(
            required=True,
            description="An OpenAI request body; `model` selects the Grid model (or `auto`).",
            content={
                "application/json": OpenAPIMediaType(
                    schema=Schema(
                        type=OpenAPIType.OBJECT,
                        description="OpenAI request body (see the external documentation).",
                    )
                )
            },
        )
    responses: dict[str, OpenAPIResponse | Reference] = {
        "200": OpenAPIResponse(
            description="The engine's OpenAI response (JSON, or server-sent events when "
            "`stream` is true)."
        ),
        "400": OpenAPIResponse(description="Malformed JSON or missing `model` (OpenAI error)."),
        "404": OpenAPIResponse(description="Unknown model (OpenAI error `model_not_found`)."),
        "503": OpenAPIResponse(
            description="No ready engine for a configured model; retry after `Retry-After`."
        ),
    }
    if method == "get":
        responses = {"200": OpenAPIResponse(description="An OpenAI model list.")}
    return Operation(
        tags=[OPENAI_TAG],
        summary=summary,
        operation_id="openai" + path.replace("/", "_").replace("_v1", ""),
        external_docs=OPENAI_DOCS,
        parameters=[
            Parameter(
                name="X-Grid-Affinity-Key",
                param_in="header",
                required=False,
                description="Optional key that keeps a conversation on one engine.",
                schema=Schema(type=OpenAPIType.STRING),
            )
        ]
        if method == "post"
        else None,
        request_body=body,
        responses=responses,
    )


def add_openai_routes(app: Litestar) -> None:
    """Describe the proxy's ``/v1`` routes in ``app``'s OpenAPI document."""
    schema = app.openapi_schema
    paths = schema.paths if schema.paths is not None else {}
    for path, method, summary in OPENAI_ROUTES:
        item = PathItem()
        setattr(item, method, _openai_operation(path, method, summary))
        paths[path] = item
    schema.paths = paths
