"""Errors the gateway answers with: a protocol code and a human sentence (docs/protocol.md §7)."""

from __future__ import annotations

from typing import Any

from gateway.protocol import ErrorCode

HTTP_STATUS = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_PROTOCOL: 400,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
}

# Beyond the base protocol's codes (docs/protocol.md §7): a checkpoint written by another agent
# graph version.
GRAPH_MISMATCH = "graph_mismatch"
# Added too, HTTP only: a JSON endpoint's body sent as another media type.
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
# The added codes and their HTTP status.
ADDED_CODES = {GRAPH_MISMATCH: 409, UNSUPPORTED_MEDIA_TYPE: 415}


class GatewayError(Exception):
    def __init__(self, code: ErrorCode | str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message
        # Extra fields for the error frame, e.g. `retry_after_s` on `rate_limited`.
        self.fields = fields

    @property
    def http_status(self) -> int:
        if self.code in ADDED_CODES:
            return ADDED_CODES[self.code]
        try:
            return HTTP_STATUS[ErrorCode(self.code)]
        except ValueError:
            return 500


def conflict(message: str) -> GatewayError:
    return GatewayError(ErrorCode.CONFLICT, message)


def not_found(message: str) -> GatewayError:
    return GatewayError(ErrorCode.NOT_FOUND, message)


def rate_limited(message: str, retry_after_s: float | None = None) -> GatewayError:
    """`retry_after_s`: when a retry would be admitted, if the limit knows (docs/protocol.md §7)."""
    if retry_after_s is None:
        return GatewayError(ErrorCode.RATE_LIMITED, message)
    return GatewayError(ErrorCode.RATE_LIMITED, message, retry_after_s=retry_after_s)
