"""The guarded WebSocket protocol (gateway/server/ws_guard.py) driven without a socket: a
connection that the WebSocket layer closed on a client's frame (one over the size limit) is,
to the application still holding it, a client gone: its sends raise `ClientDisconnected`, as
after a drop, never uvicorn's RuntimeError (logged as an ERROR with a traceback). The upgrade
request h11 parsed is handed over as websockets' parser would have made it, or, where that
parser would refuse it, goes that parser's way."""

from __future__ import annotations

import asyncio
import gc
from collections import deque
from pathlib import Path
from typing import Any

import h11
import pytest
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.server import ServerState
from websockets.frames import OP_TEXT, Frame
from websockets.http11 import Request
from websockets.streams import StreamReader

from gateway.server import http_guard
from gateway.server.config import gateway_config
from gateway.server.http_guard import GuardedH11Protocol
from gateway.server.ws_guard import SEND_FRAMES, GuardedWebSocketProtocol, upgrade_request
from tests.support import gateway as support

HANDSHAKE = (
    b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def accepted(tmp_path: Path) -> GuardedWebSocketProtocol:
    """A protocol past its handshake, its application holding the connection open."""
    hold = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "websocket.accept"})
        await hold.wait()

    settings = support.test_settings(tmp_path / "gateway.db")
    config = gateway_config(app, settings, ws_max_size=1024)
    config.load()
    protocol = GuardedWebSocketProtocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    protocol.data_received(HANDSHAKE)
    for _ in range(100):
        await asyncio.sleep(0)
        if protocol.handshake_complete:
            break
    assert protocol.handshake_complete
    return protocol


@pytest.mark.parametrize(
    "message",
    [{"type": "websocket.send", "text": "welcome"}, {"type": SEND_FRAMES, "frames": ["event"]}],
    ids=["send", "send_frames"],
)
async def test_sends_after_the_layer_closed_on_a_client_frame_are_a_client_gone(
    tmp_path: Path, message: dict[str, Any]
) -> None:
    protocol = await accepted(tmp_path)
    oversized = Frame(OP_TEXT, b"x" * 4096).serialize(mask=True)
    protocol.data_received(oversized)
    assert protocol.close_sent and not protocol.disconnected  # closed, the socket not yet lost
    with pytest.raises(ClientDisconnected):
        await protocol.send(message)  # type: ignore[arg-type]
    protocol.connection_lost(None)


async def test_an_open_connection_keeps_neither_its_handshake_nor_a_deque(tmp_path: Path) -> None:
    """What uvicorn would keep for the connection's life: the handshake's request and
    response (and their headers), an `asyncio.Queue` and an `asyncio.Event`, five deques."""
    protocol = await accepted(tmp_path)
    assert protocol.request is None and protocol.response is None
    assert protocol.scope["headers"]  # the application's copy stays
    held = [*vars(protocol).values(), *(gc.get_referents(protocol.queue, protocol.writable))]
    assert not [value for value in held if isinstance(value, deque | asyncio.Queue)]
    protocol.data_received(Frame(OP_TEXT, b"hello").serialize(mask=True))
    assert await asyncio.wait_for(protocol.receive(), 1) == {"type": "websocket.connect"}
    assert await asyncio.wait_for(protocol.receive(), 1) == {
        "type": "websocket.receive",
        "text": "hello",
    }
    protocol.connection_lost(None)


# -- the upgrade request, parsed once ------------------------------------------------------

UPGRADE = (
    b"Host: gw.example\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)
TAKEN = {
    "browser": b"GET /v1/ws?ticket=a%20b HTTP/1.1\r\n" + UPGRADE + b"Origin: http://gw.example\r\n"
    b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    b"Sec-WebSocket-Protocol: one, two\r\nSec-WebSocket-Protocol: three\r\n"
    b"User-Agent: Mozilla/5.0 (X11)\r\nCookie: a=1; b=2\r\nX-Empty:\r\n\r\n",
    "latin-1 value, escaped path": b"GET /v1/%E2%82%AC HTTP/1.1\r\n"
    + UPGRADE
    + b"X-Name: caf\xe9\tau lait\r\n\r\n",
    "a length twice (h11 keeps one)": b"GET /v1/ws HTTP/1.1\r\n"
    + UPGRADE
    + b"Content-Length: 0\r\nContent-Length: 0\r\n\r\n",
    # 8,192 bytes with its CRLF, websockets' limit on a line.
    "a header line at the limit": b"GET /v1/ws HTTP/1.1\r\n"
    + UPGRADE
    + b"X-Long: "
    + b"x" * 8182
    + b"\r\n\r\n",
    "a request line at the limit": b"GET /v1/ws?"
    + b"q" * 8170
    + b" HTTP/1.1\r\n"
    + UPGRADE
    + b"\r\n",
    "HTTP/1.0, no body": b"GET /v1/ws HTTP/1.0\r\n" + UPGRADE + b"Content-Length: 0\r\n\r\n",
}
REFUSED = {
    "POST": b"POST /v1/ws HTTP/1.1\r\n" + UPGRADE + b"Content-Length: 0\r\n\r\n",
    "a body": b"GET /v1/ws HTTP/1.1\r\n" + UPGRADE + b"Content-Length: 2\r\n\r\n",
    "a transfer coding": b"GET /v1/ws HTTP/1.1\r\n"
    + UPGRADE
    + b"Transfer-Encoding: chunked\r\n\r\n",
    "a control byte": b"GET /v1/ws HTTP/1.1\r\n" + UPGRADE + b"X-Odd: a\x01b\r\n\r\n",
    "a long header line": b"GET /v1/ws HTTP/1.1\r\n"
    + UPGRADE
    + b"X-Long: "
    + b"x" * 8183
    + b"\r\n\r\n",
    "a long request line": b"GET /v1/ws?" + b"q" * 8171 + b" HTTP/1.1\r\n" + UPGRADE + b"\r\n",
    "too many headers": b"GET /v1/ws HTTP/1.1\r\n"
    + UPGRADE
    + b"".join(b"X-%d: v\r\n" % n for n in range(130))
    + b"\r\n",
}


def parsed_by_h11(head: bytes) -> tuple[h11.Request, list[tuple[bytes, bytes]]]:
    """The request as uvicorn's h11 protocol has it when it upgrades: the event, and its
    headers with their names lowercased."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
    conn.receive_data(head)
    event = conn.next_event()
    assert isinstance(event, h11.Request)
    return event, [(name.lower(), value) for name, value in event.headers]


def parsed_by_websockets(event: h11.Request, headers: list[tuple[bytes, bytes]]) -> Request:
    """What websockets' parser makes of the head uvicorn writes out again for it (uvicorn's
    `H11Protocol.handle_websocket_upgrade`); raises where that parser refuses it."""
    head = [event.method, b" ", event.target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        head += [name, b": ", value, b"\r\n"]
    reader = StreamReader()
    reader.feed_data(b"".join(head) + b"\r\n")
    parser = Request.parse(reader.read_line)
    try:
        next(parser)
    except StopIteration as done:
        request: Request = done.value
        return request
    raise AssertionError("the head was not complete")


@pytest.mark.parametrize("head", TAKEN.values(), ids=TAKEN.keys())
def test_an_upgrade_request_is_what_websockets_would_have_parsed(head: bytes) -> None:
    event, headers = parsed_by_h11(head)
    request = upgrade_request(event, headers)
    expected = parsed_by_websockets(event, headers)
    assert request is not None
    assert request.path == expected.path
    assert list(request.headers.raw_items()) == list(expected.headers.raw_items())


@pytest.mark.parametrize("head", REFUSED.values(), ids=REFUSED.keys())
def test_a_head_websockets_would_refuse_is_left_to_its_parser(head: bytes) -> None:
    event, headers = parsed_by_h11(head)
    assert upgrade_request(event, headers) is None
    with pytest.raises(Exception):  # noqa: B017 - whichever the parser raises
        parsed_by_websockets(event, headers)


async def upgraded(tmp_path: Path, head: bytes) -> tuple[dict[str, Any] | None, bytes]:
    """`head` sent to the gateway's HTTP protocol: the scope the application saw (None if it
    saw none) and what was written back, its Date line left out."""
    scopes: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scopes.append(scope)
        await send({"type": "websocket.accept"})

    config = gateway_config(app, support.test_settings(tmp_path / "gateway.db"))
    config.load()
    protocol = GuardedH11Protocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    protocol.data_received(head)
    upgraded_to = transport.protocol
    assert isinstance(upgraded_to, GuardedWebSocketProtocol)
    for _ in range(100):
        await asyncio.sleep(0)
    upgraded_to.connection_lost(None)
    scope = None
    if scopes:
        scope = {k: v for k, v in scopes[0].items() if k not in ("state", "extensions")}
    written = b"".join(transport.written).split(b"\r\n")
    return scope, b"\r\n".join(line for line in written if not line.startswith(b"Date: "))


@pytest.mark.parametrize("head", [*TAKEN.values(), REFUSED["POST"]], ids=[*TAKEN, "POST"])
async def test_an_upgrade_parsed_once_is_answered_as_when_parsed_twice(
    tmp_path: Path, head: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    once = await upgraded(tmp_path, head)
    monkeypatch.setattr(http_guard, "upgrade_request", lambda *_: None)
    twice = await upgraded(tmp_path, head)
    assert once == twice
    scope, written = once
    if head is REFUSED["POST"]:
        assert scope is None and written.startswith(b"HTTP/1.1 400 ")
    else:
        assert scope is not None and written.startswith(b"HTTP/1.1 101 ")
