"""Request bodies of the JSON endpoints: a JSON media type, at most `MAX_BODY_BYTES`, read as
they arrive.

The size is checked before anything is kept: a declared `Content-Length` over the limit is
refused without reading a byte, and a body without one (chunked) is cut as soon as the running
count passes the limit. Reading the whole body first and measuring it afterwards let a client
make the process hold as much memory as it cared to send.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request

from gateway.protocol.error_codes import CodedError, ErrorCode, GatewayError

MAX_BODY_BYTES = 64 * 1024


class ClientGone(CodedError):
    """The client disconnected before its request body was read: nobody is left to answer."""

    CODE = ErrorCode.BAD_REQUEST


def is_json_media_type(content_type: str | None) -> bool:
    """`application/json`, or a structured `+json` type, with any parameters (charset)."""
    if not content_type:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def read_json_body(request: Request, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The body as a JSON object; an empty body is `{}`. Refusals change nothing: 415 for
    another media type, 413 over `max_bytes`, 400 for anything but a JSON object."""
    if not is_json_media_type(request.headers.get("content-type")):
        raise GatewayError(
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            "the body must be JSON (Content-Type: application/json)",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    raw = b"".join(chunks)
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise GatewayError(ErrorCode.BAD_REQUEST, "body is not valid JSON") from None
    if not isinstance(body, dict):
        raise GatewayError(ErrorCode.BAD_REQUEST, "body must be a JSON object")
    return body


def _too_large(max_bytes: int) -> GatewayError:
    return GatewayError(ErrorCode.TOO_LARGE, f"body exceeds {max_bytes} bytes")
