"""uvicorn's WebSocket protocol, with a close that a peer which stops reading cannot hold up.

uvicorn writes a message only once the transport has drained below its high-water mark, and
its close timer calls `transport.close()`, which waits for the buffer to drain too. A client
that never reads therefore kept the gateway's close frame, its handler and its socket (with
megabytes in the kernel's send queue) for as long as it stayed connected, against the promise
that the connection is dropped 10 s after the close frame (docs/protocol.md §7). Here the close
frame is queued behind whatever is buffered without waiting, and if the closing handshake has
not finished `close_timeout_s` later the transport is aborted, which releases the socket and
everything buffered for it at once.

It negotiates compression as gateway/server/compression.py says, and writes frames framed (and
compressed) once for every connection where it can (gateway/server/shared_frames.py).

It also offers the connection's writer (gateway/transport/socket_writer.py) two ways round uvicorn's
one-message-per-frame `send`, announced as the ASGI extension `SEND_FRAMES` in the scope: several
text frames in one message, written to the transport in one call, and `write_text_now`, a
synchronous write of one frame while the transport takes writes. With many watchers of one
thread, each event otherwise cost every watcher's connection a task wake-up and an ASGI message.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Any

import h11
from uvicorn._types import ASGISendEvent
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.datastructures import Headers
from websockets.exceptions import InvalidState
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request
from websockets.protocol import Protocol, State

from gateway.protocol.close_codes import CloseCode
from gateway.server.compression import message_deflate
from gateway.server.connection_limits import ServerLimits
from gateway.server.connection_state import ReceivedMessages, Writable
from gateway.server.shared_frames import SharedFrames

log = logging.getLogger("gateway.server")

# Closes the WebSocket layer decides on a client frame, as its log line says them (one INFO
# line each: nothing a client sends is an error of the server's, docs/protocol.md §2).
PARSER_CLOSES: dict[int, str] = {
    CloseCode.TOO_LARGE: "a frame over the size limit",
    CloseCode.INVALID_PAYLOAD: "a text frame that is not valid UTF-8",
}

# The ASGI extension (and its message type): `{"type": SEND_FRAMES, "frames": [str, ...]}` sends
# each string as a text frame, in order, with one write to the transport. Its scope entry holds
# `write_now`, `write_text_now` below.
SEND_FRAMES = "gateway.websocket.send_frames"

# Bytes h11 lets through in a header value and websockets' request parser refuses (it takes
# tab, space, visible ASCII and bytes from 0x80).
_REFUSED_IN_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# What websockets' line limit counts besides the fields: in a request line, the two spaces
# around the target, the version and CRLF; in a header line, ": " and CRLF.
_REQUEST_LINE_EXTRA = len(b"  HTTP/1.1\r\n")
_HEADER_LINE_EXTRA = len(b": \r\n")


def upgrade_request(event: h11.Request, headers: Sequence[tuple[bytes, bytes]]) -> Request | None:
    """The upgrade request h11 parsed (`headers` as uvicorn keeps them, names lowercased), as
    websockets' own parser would make it from the head uvicorn writes out again for it; None
    for a head that parser would refuse (not a GET, a body, a line or a header count over its
    limits, a byte it does not take in a value), which then goes that way and gets the answer
    it always had. Parsed once instead of twice, and never written out again."""
    if event.method != b"GET" or len(headers) > MAX_NUM_HEADERS:
        return None
    if len(event.method) + len(event.target) + _REQUEST_LINE_EXTRA > MAX_LINE_LENGTH:
        return None
    parsed = Headers()
    for name, value in headers:
        if (
            len(name) + len(value) + _HEADER_LINE_EXTRA > MAX_LINE_LENGTH
            or _REFUSED_IN_VALUE.search(value) is not None
        ):
            return None
        # Validated, as websockets' parser validates before it sets a header this way.
        parsed.set_insecure(name.decode("ascii"), value.decode("ascii", "surrogateescape"))
    if "transfer-encoding" in parsed or parsed.get_all("content-length") not in ([], ["0"]):
        return None
    return Request(event.target.decode("ascii", "surrogateescape"), parsed)


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """Needs a `gateway.server.config.GatewayConfig`, whose `limits.close_timeout_s` it applies,
    whose `compression` it negotiates and whose `shared_frames` it writes through."""

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        # uvicorn's own negotiation is off (`ws_per_message_deflate=False`): its connection
        # offers the gateway's instead, and logs on websockets' own logger, not uvicorn's:
        # the gateway's log configuration keeps its lines at warning
        # (gateway/observability/log_config.py). Set on uvicorn's connection rather than on
        # a second one made for the purpose, which cost every connection 2% more CPU.
        conn = self.conn
        conn.available_extensions = config.compression.extension_factories()
        conn.logger = logging.getLogger("websockets.server")
        conn.debug = conn.logger.isEnabledFor(logging.DEBUG)
        # The same state as uvicorn's, without the deques (gateway/server/connection_state.py).
        self.queue = ReceivedMessages()  # type: ignore[assignment]
        self.writable = Writable()  # type: ignore[assignment]
        self._shared_frames: SharedFrames = config.shared_frames
        limits: ServerLimits = config.limits
        self.close_timeout = limits.close_timeout_s
        self._abort_timer: asyncio.TimerHandle | None = None
        # Whether the WebSocket layer closed the connection on a client's frame.
        self._closed_on_client_frame = False

    def handle_upgrade(self, request: Request) -> None:
        """The handshake on a request parsed already (`upgrade_request`): the connection reads
        frames from here on, as websockets' parser does once it has read the request."""
        conn = self.conn
        conn.parser = Protocol.parse(conn)
        next(conn.parser)
        self.handle_connect(request)

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        if self.response.status_code != 101:
            # websockets said this one ("connection rejected") on a logger kept at warning.
            self.logger.info(
                '%s:%s - "WebSocket %s" %d %s',
                *(self.client or ("-", "-")),
                event.path.partition("?")[0],
                self.response.status_code,
                self.response.reason_phrase,
            )
        # The request's headers, copied into the scope, are read no more, but uvicorn keeps
        # the request, and so does websockets' parser (a local of its generator), for the
        # connection's life: emptied, they no longer hold 2-3 KiB of an idle connection.
        event.headers.clear()
        self.request = None  # type: ignore[assignment]
        # The application task is only scheduled yet: it sees the scope as completed here.
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][SEND_FRAMES] = {"write_now": self.write_text_now}

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] in (SEND_FRAMES, "websocket.send") and self._closed_on_client_frame:
            # The layer closed the connection under the application (which may be between
            # two awaits, a welcome on its way): to it the client is gone, as after a drop,
            # not an error of its own (uvicorn's RuntimeError, logged with a traceback).
            raise ClientDisconnected()
        if message["type"] == SEND_FRAMES:
            await self._send_frames(message["frames"])  # type: ignore[typeddict-item]
            return
        text = message.get("text") if message["type"] == "websocket.send" else None
        if (
            isinstance(text, str)
            and self.handshake_complete
            and not self.close_sent
            and self.initial_response is None
        ):
            # Through the same framing as the rest, so compression follows the same rules.
            await self._send_frames((text,))
            return
        closing = message["type"] == "websocket.close" and self.handshake_complete
        if closing and not self.close_sent:
            # Only the close frame skips the wait for the peer to read: nothing is written
            # after it but the answer to the peer's own close.
            self.writable.set()
        await super().send(message)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            # Sent: nothing reads the handshake's response (and its headers) again.
            self.response = None  # type: ignore[assignment]
        if closing and self.close_timer is not None:
            # uvicorn's timer would `close()`, which waits for the buffer to drain: abort.
            # It stays the close timer, so the peer's answering close still cancels it.
            self.close_timer.cancel()
            self.close_timer = self.loop.call_later(self.close_timeout, self._abort)

    def write_text_now(self, text: str) -> bool:
        """Write one text frame at once if the transport takes writes now; False (nothing
        written) when it is paused, the peer is gone or the connection is closing. The caller
        keeps the order: it writes this way only when nothing it sent is still waiting."""
        if (
            not self.writable.is_set()
            or self.disconnected
            or self.close_sent
            or not self.handshake_complete
            or self.initial_response is not None
        ):
            return False
        if not self.conn.writes:
            wire = self._shared_wire(text)
            if wire is not None:
                self.transport.write(wire)
                return True
        try:
            self._write_texts((text,))
        except InvalidState:
            return False
        return True

    def _shared_wire(self, text: str) -> bytes | None:
        """What `conn.send_text(text)` would produce, framed (and compressed) once for every
        connection; None when this connection must frame it itself (it is not open, it is
        in a fragmented message, or it negotiated something else)."""
        conn = self.conn
        if conn.state is not State.OPEN or conn.expect_continuation_frame:
            return None
        if not conn.extensions:
            return self._shared_frames.wire(text)
        deflate = message_deflate(conn.extensions)
        return None if deflate is None else self._shared_frames.wire_for(deflate, text)

    async def _send_frames(self, frames: Sequence[str]) -> None:
        # What uvicorn does for one `websocket.send` of text, for all of them, then one write.
        await self.writable.wait()
        if self.disconnected:
            raise ClientDisconnected()
        if not self.handshake_complete or self.close_sent or self.initial_response is not None:
            raise RuntimeError(f"{SEND_FRAMES} is only valid on an open WebSocket")
        try:
            self._write_texts(frames)
        except InvalidState:
            raise ClientDisconnected() from None

    def _write_texts(self, texts: Sequence[str]) -> None:
        """Frame each text as websockets' `send_text` does (shared frames where it can),
        then write them all in one call; `InvalidState` (nothing written) once the
        connection is no longer open."""
        conn = self.conn
        wire: list[bytes] = []
        for text in texts:
            # Whatever the connection queued itself (a pong) goes out first, with a frame
            # it makes; `send_text` raises before anything is taken from it.
            shared = None if conn.writes else self._shared_wire(text)
            if shared is None:
                conn.send_text(text.encode())
                wire.extend(conn.data_to_send())
            else:
                wire.append(shared)
        self.transport.write(b"".join(wire))

    def handle_parser_exception(self) -> None:
        close = self.conn.close_sent
        if close is not None:
            what = PARSER_CLOSES.get(close.code, "a frame it could not read")
            log.info("closing a WebSocket whose client sent %s (%d)", what, close.code)
        self._closed_on_client_frame = True
        super().handle_parser_exception()

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
