"""The `/v1/ws` endpoint: checks the origin, then serves one `Connection`.

An ASGI application rather than Starlette's `func(websocket)` form, so the connection can send
its frames through the raw ASGI `send`: Starlette's `WebSocket.send` walks its state machine
for every message, which was about a tenth of the server's time per frame in a profiled replay.
The handshake, receiving and closing still go through
Starlette's `WebSocket`.
"""

from __future__ import annotations

import logging
import secrets

from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from gateway.observability.log_fields import bound
from gateway.protocol.close_codes import CloseCode
from gateway.resources import Services
from gateway.transport.origin import origin_allowed
from gateway.transport.ws_connection import Connection

log = logging.getLogger("gateway.websocket")

# Refused origins named in the log per process, at most: a hostile page cannot grow it.
MAX_REPORTED_ORIGINS = 64


class GatewaySocket:
    def __init__(self) -> None:
        # The browser only sees a bare 403, so the log says why, once per origin: a page
        # reconnecting with back-off would otherwise repeat the same line forever.
        self._reported: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        websocket = WebSocket(scope, receive=receive, send=send)
        services: Services = websocket.app.state.services
        allowed = services.settings.browser_origins()
        if not origin_allowed(websocket, allowed):
            self._report_refusal(websocket.headers.get("origin", ""))
            # Closing before accept makes the server answer the upgrade with HTTP 403.
            await websocket.close(code=CloseCode.UPGRADE_REFUSED)
            return
        # Every log line and span of the connection's work says which connection it was.
        connection_id = secrets.token_hex(6)
        with (
            bound(connection_id=connection_id),
            services.telemetry.span("gateway.websocket", {"gateway.connection.id": connection_id}),
        ):
            await Connection(websocket, services, send=send).serve()

    def _report_refusal(self, origin: str) -> None:
        if origin in self._reported or len(self._reported) >= MAX_REPORTED_ORIGINS:
            return
        self._reported.add(origin)
        log.warning(
            "refused a WebSocket from the page at origin %r (HTTP 403): only the gateway's own "
            "origin and those listed in GATEWAY_ALLOWED_ORIGINS (--allowed-origins) may connect;"
            " add it there to allow it",
            origin[:200],
        )
