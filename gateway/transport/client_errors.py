"""What a client is told when its request fails: the one mapping from an exception to the error
it is answered with, for every transport (the HTTP API, the WebSocket's requests and
subscriptions, the frontend adapters)."""

from __future__ import annotations

from gateway.protocol.error_codes import ErrorCode, GatewayError

# A fault of the gateway's own: the client learns nothing of it, the log gets its traceback.
INTERNAL = GatewayError(ErrorCode.INTERNAL, "internal error")


def client_error(exc: BaseException) -> GatewayError | None:
    """The error answering a request that failed with `exc`: a gateway error as it is (a
    storage outage says only `unavailable`, nothing was changed); None for a fault (code
    `internal`, or no gateway error at all), which the caller logs and answers with
    `INTERNAL`, so a fault's message never reaches the client."""
    if isinstance(exc, GatewayError) and not exc.fault:
        return exc
    return None
