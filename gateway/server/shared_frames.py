"""The text frames a server writes, framed (and compressed) once for every connection.

A server's frames are not masked, so a text frame is the same bytes on every connection that
has not negotiated compression: an event published to many watchers is encoded and framed once,
not once per watcher.

With permessage-deflate (RFC 7692) that holds too when the server compresses each message on
its own (`server_no_context_takeover`, which the gateway always asks for: see
gateway/server/compression.py): a message's compressed bytes depend only on the text and the
compressor's settings, not on anything the connection sent before. So a frame is compressed once
for all the connections sharing a window size, and no connection keeps a compressor (tens of
kilobytes each) between messages. A text below the size worth compressing goes out
uncompressed, which RFC 7692 allows on a connection that negotiated the extension (RSV1 clear):
compressing a few hundred bytes of JSON on its own saves a few dozen bytes and costs a
compressor's set-up.
"""

from __future__ import annotations

import zlib

from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.frames import OP_TEXT, Frame

from gateway.server.compression import Compression

# What a sync flush ends a compressed message with, and RFC 7692 has the sender remove.
_SYNC_TAIL = b"\x00\x00\xff\xff"


class SharedFrames:
    """The wire form of the text written last, for the next connection writing it. One per
    server (the connections of a server share its event loop); it holds the last text only."""

    __slots__ = ("_compression", "_deflated", "_deflated_bits", "_payload", "_text", "_wire")

    def __init__(self, compression: Compression) -> None:
        self._compression = compression
        self._text: str | None = None
        self._payload = b""
        self._wire = b""
        self._deflated: bytes | None = None
        self._deflated_bits = 0

    def wire(self, text: str) -> bytes:
        """`text` as an uncompressed frame: what `send_text` produces without extensions."""
        if text is not self._text:
            self._take(text)
        return self._wire

    def wire_for(self, deflate: PerMessageDeflate, text: str) -> bytes:
        """`text` as a frame for a connection that negotiated `deflate` without the server's
        context takeover: compressed with its window, or plain below the size worth it."""
        if text is not self._text:
            self._take(text)
        if len(self._payload) < self._compression.min_bytes:
            return self._wire
        bits = deflate.local_max_window_bits
        if self._deflated is None or self._deflated_bits != bits:
            self._deflated = deflated_frame(self._payload, bits, self._compression)
            self._deflated_bits = bits
        return self._deflated

    def _take(self, text: str) -> None:
        self._payload = text.encode()
        self._wire = Frame(OP_TEXT, self._payload).serialize(mask=False, extensions=[])
        self._text = text
        self._deflated = None


def deflated_frame(payload: bytes, window_bits: int, compression: Compression) -> bytes:
    """A text frame of `payload` compressed as one message (RSV1 set), with `window_bits`."""
    compressor = zlib.compressobj(
        compression.level, zlib.DEFLATED, -window_bits, compression.MEM_LEVEL
    )
    data = compressor.compress(payload) + compressor.flush(zlib.Z_SYNC_FLUSH)
    if data.endswith(_SYNC_TAIL):
        data = data[: -len(_SYNC_TAIL)]
    return _frame_head(len(data)) + data


def _frame_head(length: int) -> bytes:
    """The header of a final, unmasked text frame with RSV1 set and a payload of `length`
    (RFC 6455 §5.2); websockets' `Frame.serialize` refuses reserved bits without an
    extension object to set them."""
    first = 0x80 | 0x40 | OP_TEXT  # FIN, RSV1, text
    if length < 126:
        return bytes((first, length))
    if length < 1 << 16:
        return bytes((first, 126)) + length.to_bytes(2, "big")
    return bytes((first, 127)) + length.to_bytes(8, "big")
