"""Small HTTP helpers shared by the Litestar handlers: JSON answers and the one error shape."""

from __future__ import annotations

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from grid_core.errors import GridError
from grid_core.wire import check_json_depth

MAX_CONTROL_BODY_BYTES = 256 * 1024
"""A profile, mode or token request is a few hundred bytes; 256 KiB is generous."""
MAX_OBSERVATION_BODY_BYTES = 1024 * 1024
"""A follower's forwarding call: 512 request observations of ~500 bytes each, with headroom."""
MAX_NODE_BODY_BYTES = 1024 * 1024
"""A registration or heartbeat with 256 residencies is ~100 KiB; 1 MiB leaves headroom."""


def json_response(
    data: object, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """A JSON response from plain data or msgspec structs (``headers``: e.g. an ETag)."""
    return Response(
        content=msgspec.json.encode(data),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _error(
    message: str, kind: str, status: int, details: dict[str, object] | None = None
) -> Response:
    """One JSON error body (OpenAI-like shape) for every refusal the control routes make."""
    err: dict[str, object] = {"message": message, "type": kind, "code": status}
    if details:
        err["details"] = details
    return json_response({"error": err}, status)


def error_response(exc: GridError) -> Response:
    """The error body for a handled Grid failure (``details`` when the error carries some,
    e.g. both versions of a 409 version conflict)."""
    details = getattr(exc, "details", None)
    return _error(
        str(exc),
        type(exc).__name__,
        exc.http_status,
        details if isinstance(details, dict) else None,
    )


def on_grid_error(_request: Request, exc: Exception) -> Response:
    """Litestar exception handler for :class:`GridError`."""
    assert isinstance(exc, GridError)
    return error_response(exc)


def on_http_exception(request: Request, exc: Exception) -> Response:
    """Litestar's own refusals (invalid typed body, 413, 404, 405) in Grid's error shape.

    A body the framework could not decode into the handler's Struct becomes one line naming
    the field path and the cause, e.g. ``PUT /allocator/mode: Invalid enum value 'fast' - at
    `$.mode```.
    """
    assert isinstance(exc, HTTPException)
    detail = exc.detail
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        first = exc.extra[0]
        if isinstance(first, dict) and first.get("message"):
            detail = _field_message(
                str(first["message"]), str(first.get("key") or ""), str(first.get("source"))
            )
    if exc.status_code == 413:
        limit = request.route_handler.resolve_request_max_body_size()
        detail = f"request body exceeds {limit} bytes"
    kind = "ValidationError" if exc.status_code == 400 else type(exc).__name__
    return _error(f"{request.method} {request.url.path}: {detail}", kind, exc.status_code)


def _field_message(message: str, key: str, source: str) -> str:
    """One readable line for a typed-body or parameter refusal, naming the field path."""
    if source != "body":
        return f"{message} - at {source} parameter '{key}'"
    if key == "data" and message == "'data'":  # the framework's word for a missing body
        return "a JSON object body is required; the request had none"
    if key in ("", "data") or "`$" in message:
        return message  # the body root (unknown or missing field names itself)
    return f"{message} - at `$.{key}`"


async def bounded_json(request: Request) -> None:
    """``before_request`` hook: refuse a JSON body nested deeper than the wire bound (400).

    Runs after the guards and the size limit, before the framework decodes ``data``.
    """
    if request.method in ("POST", "PUT", "PATCH"):
        check_json_depth(await request.body(), f"{request.method} {request.url.path}")
