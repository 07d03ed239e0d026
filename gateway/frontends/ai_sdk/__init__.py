"""The Vercel AI SDK's chat transports (`useChat`) on the gateway: HTTP and WebSocket, one
translation of the thread log to UI message chunks (docs/protocol.md §11)."""

from __future__ import annotations

from starlette.routing import BaseRoute, WebSocketRoute


def routes() -> list[BaseRoute]:
    from gateway.frontends.ai_sdk import http, websocket

    return [*http.routes(), WebSocketRoute("/v1/ai-sdk/ws", websocket.ChatSocket())]
