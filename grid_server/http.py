"""Small HTTP helpers shared by the Litestar handlers."""

from __future__ import annotations

import msgspec
from litestar import Request, Response

from grid_core.errors import GridError, ValidationError


class PayloadTooLarge(GridError):
    """A control request body exceeded its limit."""

    http_status = 413


def json_response(data: object, status: int = 200) -> Response:
    """A JSON response from plain data or msgspec structs."""
    return Response(
        content=msgspec.json.encode(data), status_code=status, media_type="application/json"
    )


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes.

    Raises:
        PayloadTooLarge: the body is larger than ``limit``.
    """
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        msg = f"request body exceeds {limit} bytes"
        raise PayloadTooLarge(msg)
    body = await request.body()
    if len(body) > limit:
        msg = f"request body exceeds {limit} bytes"
        raise PayloadTooLarge(msg)
    return body


def decode_object(body: bytes, what: str) -> dict[str, object]:
    """Decode a JSON object body.

    Raises:
        ValidationError: not JSON, or not an object.
    """
    try:
        doc = msgspec.json.decode(body) if body else {}
    except msgspec.DecodeError:
        msg = f"{what}: body is not valid JSON; send a JSON object"
        raise ValidationError(msg) from None
    if not isinstance(doc, dict):
        msg = f"{what}: body must be a JSON object"
        raise ValidationError(msg)
    return doc


def error_response(exc: GridError) -> Response:
    """One JSON error body for a handled failure (OpenAI-like shape)."""
    return json_response(
        {"error": {"message": str(exc), "type": type(exc).__name__, "code": exc.http_status}},
        status=exc.http_status,
    )
