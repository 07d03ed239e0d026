"""Errors the gateway answers with (docs/protocol.md §7): each has a protocol code and a human
message, and each code has one row in `ERRORS`: its HTTP status, the WebSocket close code when
it ends a connection, whether a retry may pass, and what it means.

The HTTP endpoints, the WebSocket connection, the API documents and the tables of
docs/protocol.md all read `ERRORS`; nothing else maps a code to a status or a close code.

Every exception the gateway and persistence define is a `GatewayError`, so each has the code a
client would be answered with. A fault of the gateway's own (code `internal`) is never a
client's answer: gateway/transport/client_errors.py tells the client only `internal error`.
This module is the one part of the gateway that persistence imports (its errors carry their
codes too), so it imports nothing but the close codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from http import HTTPStatus
from types import MappingProxyType
from typing import Any, ClassVar

from gateway.protocol.close_codes import CloseCode


class ErrorCode(StrEnum):
    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    RATE_LIMITED = "rate_limited"
    TOO_LARGE = "too_large"
    UNSUPPORTED_PROTOCOL = "unsupported_protocol"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"
    # Beyond the base protocol's codes: a checkpoint written by another agent graph version,
    # and (HTTP only) a JSON endpoint's body sent as another media type.
    GRAPH_MISMATCH = "graph_mismatch"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"


@dataclass(frozen=True)
class ErrorRule:
    http_status: HTTPStatus
    # The close code when this error ends a WebSocket connection (it answers the first frame,
    # a token expired, or a later hello was refused, docs/protocol.md §3); None: it never does.
    close_code: CloseCode | None
    # Whether the same request may pass later unchanged.
    retryable: bool
    # Markdown, for client authors.
    meaning: str


# In the order docs/protocol.md §7 lists them.
ERRORS: Mapping[ErrorCode, ErrorRule] = MappingProxyType(
    {
        ErrorCode.BAD_REQUEST: ErrorRule(
            HTTPStatus.BAD_REQUEST,
            CloseCode.UNAUTHORIZED,
            False,
            "malformed JSON, unknown frame type, wrong field types or values, unknown agent; on "
            "the WebSocket the socket stays open (after the hello)",
        ),
        ErrorCode.UNAUTHORIZED: ErrorRule(
            HTTPStatus.UNAUTHORIZED,
            CloseCode.UNAUTHORIZED,
            False,
            "missing or invalid credentials",
        ),
        ErrorCode.FORBIDDEN: ErrorRule(
            HTTPStatus.FORBIDDEN, None, False, "authenticated, same tenant, but not allowed"
        ),
        ErrorCode.NOT_FOUND: ErrorRule(
            HTTPStatus.NOT_FOUND,
            None,
            False,
            "no such thing in the caller's tenant (also for other tenants' objects)",
        ),
        ErrorCode.CONFLICT: ErrorRule(
            HTTPStatus.CONFLICT,
            None,
            False,
            "the request does not fit the current state (active run exists, already decided, "
            "superseded, finished run, …)",
        ),
        ErrorCode.GRAPH_MISMATCH: ErrorRule(
            HTTPStatus.CONFLICT,
            None,
            False,
            "**Addition.** The checkpoint was written by an agent graph version the registry "
            "does not accept (neither its `version` nor one of its `compatible_versions`)",
        ),
        ErrorCode.RATE_LIMITED: ErrorRule(
            HTTPStatus.TOO_MANY_REQUESTS,
            CloseCode.TOO_MANY_CONNECTIONS,
            True,
            "An abuse limit was reached (§7, Abuse limits); the frame was not handled. Limits "
            "that know when a retry will pass add **(addition)** `retry_after_s` (seconds, a "
            "number) to the error",
        ),
        ErrorCode.TOO_LARGE: ErrorRule(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            CloseCode.UNAUTHORIZED,
            False,
            "HTTP request body over 64 KiB (a declared `Content-Length` over it is refused "
            "before the body is read, a chunked body as soon as it passes the limit); on the "
            "WebSocket, an `input` over `GATEWAY_MAX_INPUT_CHARS` (an oversized WebSocket frame "
            "closes the socket instead)",
        ),
        ErrorCode.UNSUPPORTED_MEDIA_TYPE: ErrorRule(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            None,
            False,
            "**Addition.** HTTP only: the body of a JSON endpoint (`POST /v1/dev/token`, "
            "`POST /v1/approvals/{approval_id}/decision`) was not sent with "
            "`Content-Type: application/json` (or another `…+json` type); nothing was read or "
            "changed",
        ),
        ErrorCode.UNSUPPORTED_PROTOCOL: ErrorRule(
            HTTPStatus.BAD_REQUEST,
            CloseCode.UNAUTHORIZED,
            False,
            "`hello.protocol` is not 1",
        ),
        ErrorCode.UNAVAILABLE: ErrorRule(
            HTTPStatus.SERVICE_UNAVAILABLE,
            CloseCode.TRY_AGAIN,
            True,
            "the database could not be reached, the gateway is shutting down, or "
            "(**addition**) the identity provider's keys needed to check the token could not "
            "be fetched; retry later",
        ),
        ErrorCode.INTERNAL: ErrorRule(
            HTTPStatus.INTERNAL_SERVER_ERROR,
            None,
            False,
            "unexpected server error (logged with its traceback on the server)",
        ),
    }
)


def close_code_for(code: ErrorCode) -> CloseCode:
    """How a WebSocket connection that this error ends is closed."""
    close = ERRORS[code].close_code
    if close is None:
        raise ValueError(f"{code} never ends a connection")
    return close


class GatewayError(Exception):
    """A request the gateway refuses with an error code (`code`) and a sentence (`message`).

    `message` goes to the client verbatim, so it must never hold secrets or unbounded input;
    unless the code is `internal` (`fault`): then the client is told only `internal error`.
    """

    def __init__(self, code: ErrorCode | str, message: str, **fields: Any) -> None:
        # The message alone: a run that fails on a gateway error reports `str()` of it.
        super().__init__(message)
        # ErrorCode(...) refuses a code without a row in ERRORS.
        self.code = ErrorCode(code)
        self.message = message
        # Extra fields for the error frame or body, e.g. `retry_after_s` on `rate_limited`.
        self.fields = fields

    @property
    def http_status(self) -> HTTPStatus:
        return ERRORS[self.code].http_status

    @property
    def fault(self) -> bool:
        """A fault of the gateway's own, never the client's: its message is for the log."""
        return self.code is ErrorCode.INTERNAL


class CodedError(GatewayError):
    """A gateway error whose class gives its code (`CODE`): raised with a message alone, or
    none (`StorageUnavailable("...")`, `LockBusy()`). A fault unless the class says otherwise.
    """

    CODE: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(self, message: str = "") -> None:
        super().__init__(self.CODE, message)


def conflict(message: str) -> GatewayError:
    return GatewayError(ErrorCode.CONFLICT, message)


def not_found(message: str) -> GatewayError:
    return GatewayError(ErrorCode.NOT_FOUND, message)


def rate_limited(message: str, retry_after_s: float | None = None) -> GatewayError:
    """`retry_after_s`: when a retry would be admitted, if the limit knows (docs/protocol.md §7)."""
    if retry_after_s is None:
        return GatewayError(ErrorCode.RATE_LIMITED, message)
    return GatewayError(ErrorCode.RATE_LIMITED, message, retry_after_s=retry_after_s)
