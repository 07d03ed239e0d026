"""uvicorn's h11 HTTP protocol, guarded against clients that hold connections without using
them, and a bound on the number of headers.

uvicorn (0.54) closes a keep-alive connection that stays silent between requests, but not one
that never sends its first request, nor a request head or body sent a byte at a time: such
connections stayed open for as long as the client liked, and a few hundred of them used up the
process's file descriptors. Here every phase before a request is served has a deadline
(`ServerLimits`): the idle timer runs from the moment the connection is made, the head must be
complete within `header_timeout_s` and the body within `body_timeout_s`; past a deadline the
connection is closed (with 408 when nothing was answered yet). Connections beyond
`max_connections` are answered 503 and closed at once, before they cost more than the moment
it takes. h11 (rather than httptools) is used for its bound on the size of a request head.

A head h11 cannot parse (malformed, or outgrowing `max_header_bytes` while it arrives) is answered
with a coded error and closed lingering: the gateway stops sending, reads and drops what the
client still sends for up to `LINGER_S`, then closes. Closing at once, as uvicorn does, leaves the
rest of the client's head unread, and the kernel answers unread bytes with a reset that can
destroy the response before the client has read it.

A streaming response (an SSE feed) may need to end while its writer waits for a client that
does not read: uvicorn writes the next chunk only once the transport has drained, and on shutdown
it merely waits for such a response (then cancels it with an ERROR traceback). The ASGI extension
`STREAM_END` offers such a response `end_now`, which queues its last chunk behind whatever is
buffered without waiting and closes the connection (aborted if the peer has not taken it all
`close_timeout_s` later, which releases the socket and its buffers), and `on_shutdown`, a
callback run when the server starts its graceful shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from enum import Enum
from http import HTTPStatus
from typing import Any

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import ERRORS, ErrorCode
from gateway.server.connection_limits import ServerLimits
from gateway.server.ws_guard import GuardedWebSocketProtocol, upgrade_request


def refusal_response(status: HTTPStatus, body: bytes, extra_headers: bytes = b"") -> bytes:
    """A complete JSON response that closes the connection, for a request refused before any
    route sees it."""
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n%s\r\n%s"
        % (status.value, status.phrase.encode(), len(body), extra_headers, body)
    )


TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
BUSY_RESPONSE = refusal_response(
    ERRORS[ErrorCode.UNAVAILABLE].http_status,
    b'{"error":{"code":"unavailable","message":"too many open connections; retry later"}}',
    b"retry-after: 1\r\n",
)
# `bad_request` answered 431 rather than its status in gateway/protocol/error_codes.py ERRORS: the
# head itself is refused, before any route, and 431 is the status HTTP has for that.
_HEAD_TOO_LARGE = (
    b'{"error":{"code":"bad_request","message":"the request head has too many or too large '
    b'headers"}}'
)
HEAD_TOO_LARGE_RESPONSE = refusal_response(
    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, _HEAD_TOO_LARGE
)
MALFORMED_HEAD_RESPONSE = refusal_response(
    ERRORS[ErrorCode.BAD_REQUEST].http_status,
    b'{"error":{"code":"bad_request","message":"the request head is not valid HTTP/1.1"}}',
)
# The ASGI extension (scope["extensions"]) through which a streaming response ends itself:
# a `StreamEnd`.
STREAM_END = "gateway.http.stream_end"
# Long enough for a client to finish sending a refused head (`max_header_bytes` is 1 MiB at most)
# and read the answer; short enough that a lingering connection costs little.
LINGER_S = 2.0


class Phase(Enum):
    HEAD = "head"
    BODY = "body"


class StreamEnd:
    """One request's `STREAM_END` extension (see the module's docstring)."""

    __slots__ = ("_cycle", "_protocol")

    def __init__(self, protocol: GuardedH11Protocol, cycle: RequestResponseCycle) -> None:
        self._protocol = protocol
        self._cycle = cycle

    def end_now(self, last: bytes, linger_s: float | None = None) -> bool:
        """Write `last` and the end of the response without waiting for the transport, then
        close the connection, aborted if the client has not taken it all `linger_s` later
        (default: the close timeout); False (nothing written) when the response has not
        started, has ended, or the client is gone. The caller's own writer must have stopped
        first."""
        return self._protocol.end_stream(self._cycle, last, linger_s)

    def on_shutdown(self, callback: Callable[[], None] | None) -> None:
        """Run `callback` (once) when the server starts shutting down while this request's
        response is still being sent; None: nothing any more."""
        self._protocol.shutdown_callback = callback if callback is None else (self._cycle, callback)


class GuardedH11Protocol(H11Protocol):
    """Needs a `gateway.server.config.GatewayConfig`, whose `limits` it enforces."""

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.limits: ServerLimits = config.limits
        self.timeout_keep_alive = self.limits.idle_timeout_s
        self._phase: Phase | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._received = False
        # Once upgraded, the connection is the WebSocket protocol's: no HTTP phase applies.
        self._upgraded = False
        # Refused and no longer sending: what arrives is dropped until the client or LINGER_S
        # ends the connection.
        self._lingering = False
        # The cycle whose scope has its `StreamEnd`, and what its response runs at shutdown.
        self._extended: RequestResponseCycle | None = None
        self.shutdown_callback: tuple[RequestResponseCycle, Callable[[], None]] | None = None
        self._abort_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limit = self.limits.max_connections
        if limit and len(self.connections) > limit:
            self.limits.refusals.note(len(self.connections), limit)
            transport.write(BUSY_RESPONSE)
            transport.close()
            return
        # uvicorn starts its idle timer only after a first response: start it now, so a
        # connection that never sends a byte is closed like an idle keep-alive one.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )
        self._follow_phase()

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_deadline(None)
        if self._abort_timer is not None:
            self._abort_timer.cancel()
            self._abort_timer = None
        self.shutdown_callback = None
        super().connection_lost(exc)

    def shutdown(self) -> None:
        registered, self.shutdown_callback = self.shutdown_callback, None
        super().shutdown()
        if registered is not None:
            cycle, callback = registered
            if cycle is self.cycle and not cycle.response_complete:
                callback()

    def end_stream(
        self, cycle: RequestResponseCycle, last: bytes, linger_s: float | None = None
    ) -> bool:
        """`StreamEnd.end_now`."""
        if (
            cycle is not self.cycle
            or not cycle.response_started
            or cycle.response_complete
            or cycle.disconnected
            or self.transport.is_closing()
        ):
            return False
        output = self.conn.send(h11.Data(data=last)) if last else b""
        output += self.conn.send(h11.EndOfMessage())
        cycle.response_complete = True
        cycle.keep_alive = False
        cycle.message_event.set()
        self.transport.write(output)
        self.conn.send(h11.ConnectionClosed())
        self.transport.close()
        if self._abort_timer is None:
            linger_s = self.limits.close_timeout_s if linger_s is None else linger_s
            self._abort_timer = self.loop.call_later(linger_s, self._abort)
        return True

    def _abort(self) -> None:
        # Still not closed: the peer has not taken what was buffered for it.
        self._abort_timer = None
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        self._received = True
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a head h11 cannot parse: a coded error, 431 when the head grew
        past `max_header_bytes` before it was complete, and a lingering close."""
        unparsed, _ = self.conn.trailing_data
        too_large = len(unparsed) > self.limits.max_header_bytes
        self.transport.write(HEAD_TOO_LARGE_RESPONSE if too_large else MALFORMED_HEAD_RESPONSE)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = True
        self._set_deadline(LINGER_S)

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and cycle is not self._extended and not self._upgraded:
            # The application task is only scheduled yet: it sees the scope as completed here.
            self._extended = cycle
            # uvicorn types an extension's value as a dict (as the ASGI spec's own are); this one
            # is an object the response calls.
            extensions = cycle.scope.setdefault("extensions", {})
            extensions[STREAM_END] = StreamEnd(self, cycle)  # type: ignore[assignment]
        self._follow_phase()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        # From here on the WebSocket protocol owns the connection (and its own timeouts).
        self._upgraded = True
        self._set_deadline(None)
        protocol_class = self.ws_protocol_class
        request = upgrade_request(event, self.headers)
        if (
            request is None
            or protocol_class is None
            or not issubclass(protocol_class, GuardedWebSocketProtocol)
        ):
            # uvicorn writes the head out again for websockets to parse and answer.
            super().handle_websocket_upgrade(event)
            return
        # uvicorn's steps, with the request handed over as h11 parsed it.
        self.connections.discard(self)
        protocol = protocol_class(
            config=self.config, server_state=self.server_state, app_state=self.app_state
        )
        protocol.connection_made(self.transport)
        self.transport.set_protocol(protocol)
        protocol.handle_upgrade(request)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_phase()

    def _follow_phase(self) -> None:
        """Arm the deadline of the phase h11 is in; a phase keeps its deadline however many
        bytes trickle in, and a new phase starts its own."""
        if self._lingering:
            return
        if self._upgraded or self.transport.is_closing():
            self._set_deadline(None)
            return
        state = self.conn.their_state
        phase = Phase.HEAD if state is h11.IDLE else Phase.BODY if state is h11.SEND_BODY else None
        if phase is self._phase:
            return
        self._phase = phase
        if phase is Phase.HEAD:
            self._received = False
            self._set_deadline(self.limits.header_timeout_s)
        elif phase is Phase.BODY:
            self._set_deadline(self.limits.body_timeout_s)
        else:
            self._set_deadline(None)

    def _set_deadline(self, seconds: float | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if seconds is not None:
            self._deadline = self.loop.call_later(seconds, self._expired)

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._lingering:
            self.transport.close()
            return
        if self._phase is Phase.HEAD and self._received and self.conn.our_state is h11.IDLE:
            # Part of a head and no answer yet: say why before closing.
            self.transport.write(TIMEOUT_RESPONSE)
        # A request being served sees `http.disconnect`; its handler logs it as a client that
        # left (gateway/transport/http_api.py).
        self.transport.close()


class RequestHeadLimit:
    """Refuses a request (431) or a WebSocket upgrade (403) whose head has more than
    `max_headers` headers or more than `max_bytes` of them.

    h11 checks its limit on a head only while the head is incomplete: one that arrives whole
    in a single read (up to 256 KiB) would pass. Counted here, after parsing, on every head.
    """

    def __init__(self, app: ASGIApp, *, max_headers: int, max_bytes: int) -> None:
        self.app = app
        self.max_headers = max_headers
        self.max_bytes = max_bytes

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # The application's own coroutine when the head passes: no frame of this one stays
        # under a WebSocket's handler for the connection's life.
        if scope["type"] in ("http", "websocket") and self._too_large(scope):
            return self._refuse(scope, send)
        return self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": CloseCode.UPGRADE_REFUSED})
            return
        await send(
            {
                "type": "http.response.start",
                "status": HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(_HEAD_TOO_LARGE)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": _HEAD_TOO_LARGE})

    def _too_large(self, scope: Scope) -> bool:
        headers = scope["headers"]
        if len(headers) > self.max_headers:
            return True
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        # Each header line also holds ": " and CRLF.
        size += sum(len(name) + len(value) + 4 for name, value in headers)
        return size > self.max_bytes
