"""The `/v1/ws` endpoint: checks the origin, then serves one `Connection`.

An ASGI application rather than Starlette's `func(websocket)` form, so the connection can send
its frames through the raw ASGI `send`: Starlette's `WebSocket.send` walks its state machine
for every message, which was about a tenth of the server's time per frame in a profiled replay.
The handshake, receiving and closing still go through
Starlette's `WebSocket`.
"""

from __future__ import annotations

import secrets

from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from gateway.observability.log_fields import bound
from gateway.resources import Services
from gateway.transport.origin import OriginGate
from gateway.transport.ws_connection import Connection


class GatewaySocket:
    def __init__(self, origins: OriginGate) -> None:
        self._origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        websocket = WebSocket(scope, receive=receive, send=send)
        services: Services = websocket.app.state.services
        if not await self._origins.admit(websocket, services.settings):
            return
        # Every log line and span of the connection's work says which connection it was.
        connection_id = secrets.token_hex(6)
        with (
            bound(connection_id=connection_id),
            services.telemetry.span("gateway.websocket", {"gateway.connection.id": connection_id}),
        ):
            await Connection(websocket, services, send=send).serve()
