"""The Vercel AI SDK's chat transports (`useChat`) on the gateway: HTTP and WebSocket, one
translation of the thread log to UI message chunks (docs/protocol.md §11)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.routing import BaseRoute, WebSocketRoute

if TYPE_CHECKING:
    from gateway.transport.origin import OriginGate


def routes(origins: OriginGate) -> list[BaseRoute]:
    from gateway.frontends.ai_sdk import http, websocket

    return [*http.routes(), WebSocketRoute("/v1/ai-sdk/ws", websocket.ChatSocket(origins))]
