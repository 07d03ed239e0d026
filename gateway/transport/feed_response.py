"""A streaming HTTP response that ends when it should, whether or not its client reads.

Every feed the gateway streams over HTTP (the SSE feeds of docs/protocol.md §8, the AI SDK's
and AG-UI's streams) is one of these. Its body is written by a writer task, while the response
itself watches what may end it from outside the body:

- the token's `exp` (plus `GATEWAY_JWT_LEEWAY_S`), as a WebSocket is closed then;
- a client that takes nothing of what was written for `GATEWAY_SEND_TIMEOUT_S` (the write
  waits for the transport to drain), as a WebSocket whose outgoing queue stays full is closed
  (`CloseCode.TOO_SLOW`): the feed's own queue is bounded in frames and bytes, so such a
  client holds no more than that while it lasts;
- the server's graceful shutdown, as a WebSocket is closed then (`CloseCode.RESTART`);
- the client leaving.

Each but the last ends the feed with a last word (the feed's kind says how: an SSE event, an
error chunk, a comment) naming the WebSocket close code of the same case, then closes the
connection. A writer waiting for a client that does not read cannot write it, so it is stopped
and the last word goes out through the server's `STREAM_END` extension
(gateway/server/http_guard.py), queued behind what is buffered without waiting; a client that
never takes it is dropped `CLOSE_TIMEOUT_S` later (`SHUTDOWN_LINGER_S` at shutdown, which waits
for every connection to close).

The feed holds one of its user's open-connection slots (GATEWAY_MAX_CONNECTIONS_PER_USER counts
WebSockets and feeds alike) until it ends, however it ends: the body may never be started when
the client leaves at once, so the slot is not the body's to release.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.abuse.limits import ConnectionSlot
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import CodedError
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.server.connection_limits import CLOSE_TIMEOUT_S
from gateway.server.http_guard import STREAM_END, StreamEnd

log = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"

# Why the gateway ends a feed, as the client is told (its WebSocket close code is beside it).
END_MESSAGES: dict[CloseCode, str] = {
    CloseCode.TOO_SLOW: "the feed fell behind (the client read too slowly): reconnect to resume",
    CloseCode.UNAUTHORIZED: "the token has expired: reconnect with a fresh token to resume",
    CloseCode.RESTART: "the gateway is shutting down: reconnect to resume",
    CloseCode.INTERNAL: "the thread's log could not be read: reconnect to resume",
}


class FeedEnded(CodedError):
    """Raised by a feed's body to end the feed with the last word of `code`, as the feed ends
    itself at the token's expiry or for a client that stopped reading. (Caught by the feed:
    no client sees it as an error.)"""

    def __init__(self, code: CloseCode) -> None:
        super().__init__(END_MESSAGES[code])
        self.close_code = code


# At shutdown the server waits for every connection to close: a client that does not take the
# last word within this long is not waited for (a reading client takes it at once).
SHUTDOWN_LINGER_S = 1.0

# The bytes a feed of some kind ends with, for a close code of END_MESSAGES.
LastWord = Callable[[CloseCode], bytes]


def comment_last_word(code: CloseCode) -> bytes:
    """An SSE comment: the last word of a stream whose format has no event for it."""
    return f": end {int(code)} {END_MESSAGES[code]}\n\n".encode()


class FeedResponse(Response):
    def __init__(
        self,
        body: AsyncIterator[bytes],
        slot: ConnectionSlot,
        *,
        services: Services,
        principal: Principal,
        last_word: LastWord = comment_last_word,
        headers: dict[str, str] | None = None,
    ) -> None:
        # Headers as a body of unknown length has them (no content-length); no caching or
        # buffering proxy may hold back a live feed.
        self.status_code = 200
        self.media_type = MEDIA_TYPE
        self.background = None
        self.init_headers(
            {"cache-control": "no-store", "x-accel-buffering": "no", **(headers or {})}
        )
        self._body = body
        self._slot = slot
        self._last_word = last_word
        self._send_timeout_s = services.settings.send_timeout_s
        self._deadline: float | None = None
        if principal.expires_at is not None:
            self._deadline = principal.expires_at + services.verifier.leeway_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._serve(scope, receive, send)
        finally:
            self._slot.release()

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        # Why the feed ends from outside its body: a close code, or None when the client left.
        ended: asyncio.Future[CloseCode | None] = loop.create_future()

        def end(code: CloseCode | None) -> None:
            if not ended.done():
                ended.set_result(code)

        control: StreamEnd | None = scope.get("extensions", {}).get(STREAM_END)
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        writer = loop.create_task(self._write(send, end, ended), name="feed-writer")
        listener = loop.create_task(self._listen(receive, end), name="feed-listener")
        expiry = None
        if self._deadline is not None:
            # `exp` is wall-clock time; the timer runs on the loop's monotonic clock.
            expiry = loop.call_later(
                max(0.0, self._deadline - time.time()), end, CloseCode.UNAUTHORIZED
            )
        if control is not None:
            control.on_shutdown(lambda: end(CloseCode.RESTART))
        try:
            waits: set[asyncio.Future[Any]] = {writer, ended}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if expiry is not None:
                expiry.cancel()
            if control is not None:
                control.on_shutdown(None)
            listener.cancel()
            if not writer.done():
                writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(writer, listener, return_exceptions=True)
        code = ended.result() if ended.done() else None
        if code is None:
            # The body ended (the writer finished the response) or the client left.
            if writer.done() and not writer.cancelled():
                writer.result()
            return
        if code is CloseCode.TOO_SLOW:
            log.info("ending a feed whose client stopped reading")
        last = self._last_word(code)
        if control is not None:
            control.end_now(last, SHUTDOWN_LINGER_S if code is CloseCode.RESTART else None)
            return
        # Served by another server: written as usual, for as long as a close may take.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                send({"type": "http.response.body", "body": last, "more_body": False}),
                CLOSE_TIMEOUT_S,
            )

    async def _write(
        self,
        send: Send,
        end: Callable[[CloseCode | None], None],
        ended: asyncio.Future[CloseCode | None],
    ) -> None:
        try:
            async for chunk in self._body:
                # Stopped by cancelling it, but a cancellation can be lost (asyncio.wait_for in
                # Python 3.11 drops one that meets a result): it stops at its next chunk then.
                if ended.done():
                    return
                try:
                    # The send waits while the transport is full: the client is not reading.
                    async with asyncio.timeout(self._send_timeout_s):
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except TimeoutError:
                    end(CloseCode.TOO_SLOW)
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except FeedEnded as stop:
            end(stop.close_code)
        finally:
            with contextlib.suppress(Exception):
                await self._body.aclose()  # type: ignore[attr-defined]

    async def _listen(self, receive: Receive, end: Callable[[CloseCode | None], None]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        end(None)
