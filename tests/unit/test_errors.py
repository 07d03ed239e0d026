"""The error table and the error hierarchy (docs/protocol.md §7), by value.

The wire values are the contract: every code's HTTP status and close code, and every close
code's number, are pinned here as literals, so a change to them is a deliberate edit of this
file and never a side effect.
"""

from __future__ import annotations

import pytest

from gateway.auth.access import AccessDenied, AuthError, AuthUnavailable
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import (
    ERRORS,
    ErrorCode,
    GatewayError,
    close_code_for,
    conflict,
    not_found,
    rate_limited,
)
from gateway.protocol.frames import ProtocolError, parse_client_frame
from persistence.errors import StorageUnavailable

# code -> (HTTP status, close code when the error ends a WebSocket connection, retryable)
WIRE = {
    "bad_request": (400, 4001, False),
    "unauthorized": (401, 4001, False),
    "forbidden": (403, None, False),
    "not_found": (404, None, False),
    "conflict": (409, None, False),
    "graph_mismatch": (409, None, False),
    "rate_limited": (429, 4029, True),
    "too_large": (413, 4001, False),
    "unsupported_media_type": (415, None, False),
    "unsupported_protocol": (400, 4001, False),
    "unavailable": (503, 1013, True),
    "internal": (500, None, False),
}

CLOSE_CODES = {
    "NORMAL": 1000,
    "GOING_AWAY": 1001,
    "INVALID_PAYLOAD": 1007,
    "UPGRADE_REFUSED": 1008,
    "TOO_LARGE": 1009,
    "INTERNAL": 1011,
    "RESTART": 1012,
    "TRY_AGAIN": 1013,
    "UNAUTHORIZED": 4001,
    "FLOODING": 4008,
    "TOO_SLOW": 4009,
    "TOO_MANY_CONNECTIONS": 4029,
}


def test_the_table_holds_every_code_with_its_wire_values() -> None:
    table = {
        str(code): (
            int(rule.http_status),
            None if rule.close_code is None else int(rule.close_code),
            rule.retryable,
        )
        for code, rule in ERRORS.items()
    }
    assert table == WIRE
    assert {str(code) for code in ErrorCode} == set(WIRE)


def test_every_code_has_a_meaning() -> None:
    for code, rule in ERRORS.items():
        assert rule.meaning.strip(), code
        assert "\n" not in rule.meaning, f"{code}: a meaning is one line of a table"


def test_close_codes_by_value() -> None:
    assert {code.name: int(code) for code in CloseCode} == CLOSE_CODES
    for code in CloseCode:
        assert code.meaning.strip() and "\n" not in code.meaning, code.name
    # Members compare and serialize as the plain numbers the WebSocket layer sends.
    assert CloseCode(4009) is CloseCode.TOO_SLOW
    assert CloseCode.TOO_SLOW == 4009


def test_the_close_code_of_an_error_that_ends_a_connection() -> None:
    assert close_code_for(ErrorCode.UNAUTHORIZED) == 4001
    assert close_code_for(ErrorCode.UNSUPPORTED_PROTOCOL) == 4001
    assert close_code_for(ErrorCode.UNAVAILABLE) == 1013
    assert close_code_for(ErrorCode.RATE_LIMITED) == 4029
    with pytest.raises(ValueError, match="never ends a connection"):
        close_code_for(ErrorCode.FORBIDDEN)


def test_a_gateway_error_carries_its_code_message_and_status() -> None:
    error = GatewayError("conflict", "run already active")
    assert error.code is ErrorCode.CONFLICT
    assert error.message == "run already active"
    # str() is the message alone: a run that fails on it reports it as such.
    assert str(error) == "run already active"
    assert error.http_status == 409
    assert error.fields == {}
    with pytest.raises(ValueError):
        GatewayError("no_such_code", "nope")


def test_the_constructors_give_their_codes() -> None:
    assert (conflict("c").code, conflict("c").http_status) == (ErrorCode.CONFLICT, 409)
    assert (not_found("n").code, not_found("n").http_status) == (ErrorCode.NOT_FOUND, 404)
    limited = rate_limited("slow down", retry_after_s=1.5)
    assert (limited.code, limited.http_status, limited.fields) == (
        ErrorCode.RATE_LIMITED,
        429,
        {"retry_after_s": 1.5},
    )
    assert rate_limited("full").fields == {}


def test_a_storage_outage_tells_the_client_only_that_nothing_was_changed() -> None:
    outage = StorageUnavailable("storage unavailable: OperationalError")
    assert isinstance(outage, GatewayError)
    assert (outage.code, outage.http_status) == (ErrorCode.UNAVAILABLE, 503)
    assert outage.message == "storage is unavailable; nothing was changed"
    # What failed is for the log, and for a run that fails on it.
    assert str(outage) == "storage unavailable: OperationalError"


def test_access_denied_is_a_coded_gateway_error() -> None:
    for code, status in (("forbidden", 403), ("not_found", 404)):
        denied = AccessDenied(code, "not yours")  # type: ignore[arg-type]
        assert isinstance(denied, GatewayError)
        assert (denied.code, denied.message, denied.http_status) == (code, "not yours", status)


def test_authentication_errors_are_coded_gateway_errors() -> None:
    refused = AuthError("token has expired")
    assert isinstance(refused, GatewayError)
    assert (refused.code, refused.http_status) == (ErrorCode.UNAUTHORIZED, 401)
    assert close_code_for(refused.code) == 4001
    unavailable = AuthUnavailable("keys could not be fetched")
    assert isinstance(unavailable, AuthError)
    assert (unavailable.code, unavailable.http_status) == (ErrorCode.UNAVAILABLE, 503)
    assert close_code_for(unavailable.code) == 1013


def test_a_protocol_error_is_a_coded_gateway_error_with_its_ref() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_client_frame('{"type": "nope", "id": "f1"}')
    error = info.value
    assert isinstance(error, GatewayError)
    assert (error.code, error.http_status, error.ref) == (ErrorCode.BAD_REQUEST, 400, "f1")
    assert error.to_frame() == {
        "type": "error",
        "ref": "f1",
        "code": "bad_request",
        "message": error.message,
    }
