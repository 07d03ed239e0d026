"""The gateway's application serves its WebSocket routes before its middleware stack and router
(gateway/transport/socket_routes.py): matched as the router matches them, under a mount's
prefix too, while HTTP and unknown sockets go the usual way, and middleware added later is
not skipped."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.transport.socket_routes import SocketsFirst


class Recorded:
    """A middleware noting the type and path of every scope through it in `seen`."""

    def __init__(self, app: ASGIApp, seen: list[tuple[str, str]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            self.seen.append((scope["type"], scope["path"]))
        await self.app(scope, receive, send)


class Echo:
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        websocket = WebSocket(scope, receive=receive, send=send)
        await websocket.accept()
        # The application is the gateway's, as under Starlette's own routing.
        assert isinstance(websocket.app, SocketsFirst)
        await websocket.send_text(f"{scope['path']} {await websocket.receive_text()}")
        await websocket.close()


async def hello(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("hi")


def application(seen: list[tuple[str, str]]) -> SocketsFirst:
    return SocketsFirst(
        routes=[Route("/hello", hello), WebSocketRoute("/ws", Echo())],
        middleware=[Middleware(Recorded, seen=seen)],
    )


def exchange(client: TestClient, path: str) -> Any:
    with client.websocket_connect(path) as websocket:
        websocket.send_text("ping")
        return websocket.receive_text()


def test_a_socket_skips_the_stack_and_http_goes_through_it() -> None:
    seen: list[tuple[str, str]] = []
    with TestClient(application(seen)) as client:
        assert exchange(client, "/ws") == "/ws ping"
        assert client.get("/hello").text == "hi"
    assert seen == [("http", "/hello")]


def test_an_unknown_socket_path_is_refused_by_the_router() -> None:
    seen: list[tuple[str, str]] = []
    with TestClient(application(seen)) as client:
        with pytest.raises(WebSocketDisconnect):
            exchange(client, "/nowhere")
    assert seen == [("websocket", "/nowhere")]


def test_under_a_mount_the_socket_is_matched_below_the_prefix() -> None:
    seen: list[tuple[str, str]] = []
    host = Starlette(routes=[Mount("/chat", app=application(seen))])
    with TestClient(host) as client:
        assert exchange(client, "/chat/ws") == "/chat/ws ping"
    assert seen == []


def test_middleware_added_later_is_not_skipped() -> None:
    seen: list[tuple[str, str]] = []
    later: list[tuple[str, str]] = []
    app = application(seen)
    app.add_middleware(Recorded, seen=later)
    with TestClient(app) as client:
        assert exchange(client, "/ws") == "/ws ping"
    assert later == [("websocket", "/ws")] and seen == [("websocket", "/ws")]
