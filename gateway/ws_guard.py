"""uvicorn's WebSocket protocol, with a close that a peer which stops reading cannot hold up.

uvicorn writes a message only once the transport has drained below its high-water mark, and
its close timer calls `transport.close()`, which waits for the buffer to drain too. A client
that never reads therefore kept the gateway's close frame, its handler and its socket (with
megabytes in the kernel's send queue) for as long as it stayed connected, against the promise
that the connection is dropped 10 s after the close frame (docs/protocol.md §7). Here the close
frame is queued behind whatever is buffered without waiting, and if the closing handshake has
not finished `close_timeout_s` later the transport is aborted, which releases the socket and
everything buffered for it at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from gateway.server_limits import ServerLimits


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """Needs a `gateway.server.GatewayConfig`, whose `limits.close_timeout_s` it applies."""

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        limits: ServerLimits = config.limits
        self.close_timeout = limits.close_timeout_s
        self._abort_timer: asyncio.TimerHandle | None = None

    async def send(self, message: ASGISendEvent) -> None:
        closing = message["type"] == "websocket.close" and self.handshake_complete
        if closing and not self.close_sent:
            # Only the close frame skips the wait for the peer to read: nothing is written
            # after it but the answer to the peer's own close.
            self.writable.set()
        await super().send(message)
        if closing and self.close_timer is not None:
            # uvicorn's timer would `close()`, which waits for the buffer to drain: abort.
            # It stays the close timer, so the peer's answering close still cancels it.
            self.close_timer.cancel()
            self.close_timer = self.loop.call_later(self.close_timeout, self._abort)

    def keepalive_timeout(self) -> None:
        super().keepalive_timeout()
        self._abort_later()

    async def run_asgi(self) -> None:
        await super().run_asgi()
        if self.close_timer is None:
            # The handler returned without a close frame (uvicorn has closed the transport):
            # what is still buffered may wait behind unread data.
            self._abort_later()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abort_timer is not None:
            self._abort_timer.cancel()
            self._abort_timer = None
        super().connection_lost(exc)

    def _abort_later(self) -> None:
        if self._abort_timer is None and not self.disconnected:
            self._abort_timer = self.loop.call_later(self.close_timeout, self._abort)

    def _abort(self) -> None:
        self._abort_timer = None
        self.close_timer = None
        if not self.disconnected:
            self.transport.abort()
