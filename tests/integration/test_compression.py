"""WebSocket compression as browsers negotiate it (gateway/server/compression.py): the offer
every browser makes is accepted without context takeover either way, short frames go out
uncompressed, long ones compressed on their own (each inflates without any earlier message),
and `GATEWAY_WS_COMPRESSION=off` declines the offer.

The client here is a raw socket, so the test sees what is on the wire: the handshake's
`Sec-WebSocket-Extensions` and each frame's RSV1 bit."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import zlib
from collections.abc import Callable
from typing import Any

from websockets.frames import OP_TEXT, Frame

from tests.support.gateway import Gateway

# What Chrome offers.
BROWSER_OFFER = "permessage-deflate; client_max_window_bits"


class RawSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, gw: Gateway) -> tuple[RawSocket, dict[str, str]]:
        """A WebSocket handshake offering permessage-deflate; the socket and the response's
        headers (lower-cased names)."""
        host, port = gw.http_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET /v1/ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: {BROWSER_OFFER}\r\n\r\n"
            ).encode()
        )
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode()
        status, *lines = head.strip().split("\r\n")
        assert " 101 " in status, head
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return cls(reader, writer), headers

    def send(self, frame: dict[str, Any]) -> None:
        """An uncompressed, masked text frame (a client may always send one uncompressed)."""
        data = json.dumps(frame).encode()
        self.writer.write(Frame(OP_TEXT, data).serialize(mask=True))

    async def receive(self) -> tuple[bool, int, dict[str, Any]]:
        """The next text frame: whether it came compressed (RSV1), its text's length in
        bytes, and its JSON."""
        first, second = await asyncio.wait_for(self.reader.readexactly(2), 30)
        assert first & 0x0F == OP_TEXT and first & 0x80, "a final text frame"
        length = second & 0x7F
        if length == 126:
            length = int.from_bytes(await self.reader.readexactly(2), "big")
        elif length == 127:
            length = int.from_bytes(await self.reader.readexactly(8), "big")
        payload = await self.reader.readexactly(length)
        compressed = bool(first & 0x40)
        if compressed:
            # Each message on its own: a fresh decompressor, no earlier message's window.
            payload = zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff")
        return compressed, len(payload), json.loads(payload)

    async def until(
        self, done: Callable[[dict[str, Any]], bool]
    ) -> list[tuple[bool, int, dict[str, Any]]]:
        frames = []
        while True:
            compressed, size, frame = await self.receive()
            if frame.get("type") == "ping":
                self.send({"type": "pong"})
                continue
            frames.append((compressed, size, frame))
            if done(frame):
                return frames

    def close(self) -> None:
        self.writer.close()


async def test_a_browsers_offer_is_taken_per_message_and_long_frames_are_compressed(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(ws_compression_min_bytes=600) as gw:
        raw, headers = await RawSocket.open(gw)
        try:
            extension = headers["sec-websocket-extensions"]
            assert extension.split("; ") == [
                "permessage-deflate",
                "server_no_context_takeover",
                "client_no_context_takeover",
                "server_max_window_bits=12",
            ]
            raw.send({"type": "hello", "protocol": 1, "token": gw.token("alice")})
            raw.send({"type": "run.start", "id": "s1", "input": "tell me a story"})
            frames = await raw.until(lambda f: f.get("event") == "run.completed")
        finally:
            raw.close()
    assert frames[0][2]["type"] == "welcome"
    # Compressed exactly when long enough, every message inflating on its own.
    assert [compressed for compressed, _, _ in frames] == [size >= 600 for _, size, _ in frames]
    assert any(compressed for compressed, _, _ in frames)
    assert any(not compressed for compressed, _, _ in frames)
    deltas = [f["data"]["delta"] for _, _, f in frames if f.get("event") == "message.delta"]
    (completed,) = [f for _, _, f in frames if f.get("event") == "message.completed"]
    assert "".join(deltas) == completed["data"]["text"]


async def test_compression_off_declines_the_offer(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(ws_compression="off") as gw:
        raw, headers = await RawSocket.open(gw)
        try:
            assert "sec-websocket-extensions" not in headers
            raw.send({"type": "hello", "protocol": 1, "token": gw.token("alice")})
            compressed, _, welcome = await raw.receive()
            assert welcome["type"] == "welcome" and not compressed
        finally:
            raw.close()
