"""The guarded WebSocket protocol (gateway/server/ws_guard.py) driven without a socket: a
connection that the WebSocket layer closed on a client's frame (one over the size limit) is,
to the application still holding it, a client gone: its sends raise `ClientDisconnected`, as
after a drop, never uvicorn's RuntimeError (logged as an ERROR with a traceback)."""

from __future__ import annotations

import asyncio
import gc
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.server import ServerState
from websockets.frames import OP_TEXT, Frame

from gateway.server.config import gateway_config
from gateway.server.ws_guard import SEND_FRAMES, GuardedWebSocketProtocol
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
