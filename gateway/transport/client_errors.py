"""What a client is told when its request fails: the one mapping from an exception to the error
it is answered with, for every transport (the HTTP API, the WebSocket's requests and
subscriptions, the frontend adapters)."""

from __future__ import annotations

from gateway.protocol.error_codes import ErrorCode, GatewayError, storage_unavailable
from gateway.storage.health import StorageUnavailable

# A fault of the gateway's own: the client learns nothing of it, the log gets its traceback.
INTERNAL = GatewayError(ErrorCode.INTERNAL, "internal error")


def client_error(exc: BaseException) -> GatewayError | None:
    """The error answering a request that failed with `exc`: a gateway error as it is, a
    storage outage as `unavailable` (nothing was changed, retry); None for anything else, a
    fault the caller logs and answers with `INTERNAL`."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, StorageUnavailable):
        return storage_unavailable()
    return None
