"""The WebSocket endpoint's adapter: moves frames between the socket and the connection's
protocol session (gateway/protocol/session.py), and performs what the session decides.

A connection only *watches* runs: closing it unsubscribes and nothing else, so a socket never
decides a run's fate. Outgoing frames go through one queue bounded in frames and in bytes
(gateway/transport/outbox.py); a client too slow to drain it during live streaming is closed with
`CloseCode.TOO_SLOW` and catches up with `after_seq`. Abuse limits (frames per second, runs per
minute, connections per user, subscriptions, pending inputs) come from the shared `Limits` and
are answered with `rate_limited` or a close code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Coroutine
from typing import Any

from starlette.types import Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gateway.abuse.limits import ConnectionSlot
from gateway.protocol import frames as protocol
from gateway.protocol import session
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.protocol.frames import ProtocolError
from gateway.protocol.identity import Principal
from gateway.protocol.session import Closed, ConnectionSession
from gateway.resources import Services
from gateway.server.connection_limits import CLOSE_TIMEOUT_S
from gateway.transport.outbox import Outbox
from gateway.transport.socket_writer import SocketWriter
from gateway.transport.ws_hello_check import check_hello_token
from gateway.transport.ws_requests import ClientRequests
from gateway.transport.ws_watches import Watches

log = logging.getLogger(__name__)

# The heartbeat's frame, the same text for every connection.
PING = protocol.encode(protocol.ping())


class Connection:
    def __init__(self, websocket: WebSocket, services: Services, send: Send | None = None) -> None:
        self._ws = websocket
        # The writer's frames go out through the raw ASGI `send` when given
        # (gateway/transport/ws_endpoint.py says why); the handshake and the close go through
        # `websocket`.
        self._send_message: Send = send if send is not None else websocket.send
        self._services = services
        self._settings = services.settings
        self._session = ConnectionSession(
            session.ServerIdentity(
                services.server_name, services.server_version, self._settings.heartbeat_s
            )
        )
        self._outbox = Outbox(self._settings.send_queue_size, self._settings.send_queue_bytes)
        self._socket = SocketWriter(
            self._outbox,
            self._send_message,
            websocket.scope if send is not None else None,
            services.metrics.delivered if services.metrics is not None else None,
        )
        self._watches = Watches(services, self, self._session)
        self._requests = ClientRequests(services, self._watches, self)
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing: asyncio.Task[None] | None = None
        # Timers rather than tasks that sleep: every idle connection holds them, and a timer
        # handle is a tenth of a task with its coroutine and its sleep's future.
        self._heartbeat: asyncio.TimerHandle | None = None
        # Closes the connection when the current token expires; moved by a new hello.
        self._expiry: asyncio.TimerHandle | None = None
        self._limits = services.limits
        self._gate = services.limits.frame_gate()
        self._slot: ConnectionSlot | None = None
        self._metrics = services.metrics

    # -- lifecycle -------------------------------------------------------------------------

    async def serve(self) -> None:
        await self._ws.accept()
        log.debug("connection accepted")
        self._services.connections.add(self)
        if self._metrics is not None:
            self._metrics.connections.inc()
        try:
            await self._handshake()
            await self._reader()
        except (WebSocketDisconnect, Closed):
            pass
        finally:
            # First, before anything that could raise: a leaked slot would lock the user out.
            if self._slot is not None:
                self._slot.release()
            self._services.connections.discard(self)
            if self._metrics is not None:
                self._metrics.connections.dec()
            await self._cleanup()

    async def _cleanup(self) -> None:
        self._watches.close_all()
        self._stop_timers()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._closing is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._closing), CLOSE_TIMEOUT_S)
        code = self._session.close_code or CloseCode.NORMAL
        await self._close(code)
        self._session.handle(session.Disconnected())
        log.debug("connection closed (%d)", code)

    async def _close(self, code: CloseCode) -> None:
        if self._ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await self._ws.close(code)

    def close_soon(self, code: CloseCode) -> None:
        """Close from outside the reader (overflow, shutdown): stop the reader and writer."""
        # Only the first decision to close counts: a connection is closed once.
        first = bool(self._session.handle(session.CloseRequested(code)))
        if first and code == CloseCode.TOO_SLOW and self._metrics is not None:
            self._metrics.slow_closes.inc()
        self._stop_timers()
        for task in self._tasks:
            task.cancel()
        # Nobody will send what is queued: drop it, so a reader or subscription waiting for
        # room wakes up and sees the connection is closing.
        while not self._outbox.empty():
            self._outbox.get_nowait()
        if self._closing is None:
            # Kept and awaited by `_cleanup`: the close frame may wait behind data a slow
            # client has yet to read, and the handler must not return (which drops the TCP
            # connection) before it is written.
            self._closing = asyncio.get_running_loop().create_task(self._close(code))

    # -- the session's actions -------------------------------------------------------------

    async def _step(self, event: session.Event) -> None:
        for action in self._session.handle(event):
            await self._perform(action)

    async def _perform(self, action: session.Action) -> None:
        match action:
            case session.Open(welcome=welcome, principal=principal):
                await self._send_now(welcome)
                self._tasks.append(asyncio.create_task(self._writer(), name="ws-writer"))
                self._beat_later()
                self._watch_expiry(principal)
            case session.Authenticate(token=token, first=first):
                await self._step(await self._authenticate(token, first=first))
            case session.Renewed(welcome=welcome, principal=principal, roles_changed=roles_changed):
                self._watch_expiry(principal)
                await self.send_or_queue(welcome)
                if roles_changed:
                    await self._watches.drop_lost_access(principal)
            case session.Perform(frame=frame, principal=principal):
                reply = await self._requests.perform(frame, principal)
                # Frames without an id get no ack (docs/protocol.md §2).
                if reply is not None and not (reply.get("type") == "ack" and frame.id is None):
                    await self.send_or_queue(reply)
            case session.Close(code=code, last_word=last_word):
                if last_word is not None:
                    await self._end_with(last_word, code)
                raise Closed()
            case session.Reply(frame=frame):
                await self.send_or_queue(frame)

    async def _authenticate(self, token: str, *, first: bool) -> session.Event:
        """Check a hello's token; the first also takes one of the user's connection slots."""
        try:
            checked = await check_hello_token(self._services, token, source=self._source())
        except Exception:
            if not first:
                self._session.handle(session.TokenCheckAbandoned())
            raise
        if not first or not isinstance(checked, session.Authenticated):
            return checked
        principal = checked.principal
        try:
            self._slot = self._limits.open_connection(principal.tenant, principal.user)
        except GatewayError as exc:
            return session.ConnectionRefused(exc.message)
        return session.Authenticated(dataclasses.replace(principal, source=self._source()))

    async def _end_with(self, frame: dict[str, Any], code: CloseCode) -> None:
        """Send `frame` as the connection's last word, then close with `code`.

        Queued frames are dropped: they were meant for an authentication that no longer holds.
        """
        self._stop_timers()
        current = asyncio.current_task()
        others = [task for task in self._tasks if task is not current]
        for task in others:
            task.cancel()
        # The writer must have stopped before writing directly: two senders could interleave.
        await asyncio.gather(*others, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._send_now(frame), CLOSE_TIMEOUT_S)
        self.close_soon(code)

    # -- token lifetime --------------------------------------------------------------------

    def _watch_expiry(self, principal: Principal) -> None:
        """Arm the close at the token's expiry (plus leeway), replacing any earlier one."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if principal.expires_at is None:
            return
        deadline = principal.expires_at + self._services.verifier.leeway_s
        # `exp` is wall-clock time; the timer runs on the loop's monotonic clock.
        self._expiry = asyncio.get_running_loop().call_later(
            max(0.0, deadline - time.time()), self._expire
        )

    def _expire(self) -> None:
        self._expiry = None
        self._tasks.append(asyncio.create_task(self._expired(), name="ws-token-expiry"))

    async def _expired(self) -> None:
        with contextlib.suppress(Closed):
            await self._step(session.TokenExpired())

    def _stop_timers(self) -> None:
        for timer in (self._heartbeat, self._expiry):
            if timer is not None:
                timer.cancel()
        self._heartbeat = self._expiry = None

    # -- reading ---------------------------------------------------------------------------

    async def _handshake(self) -> None:
        # A deadline on this task, not `wait_for`'s task of its own: a connection's hello
        # then costs no task and no extra turn of the loop.
        try:
            async with asyncio.timeout(self._settings.hello_timeout_s):
                raw = await self._receive_text()
        except TimeoutError:
            await self._step(session.HelloTimedOut())
            return
        await self._step(self._parse(raw))

    def _parse(self, raw: str) -> session.FrameArrived | session.FrameInvalid:
        try:
            frame = protocol.parse_client_frame(raw, max_input_chars=self._settings.max_input_chars)
        except ProtocolError as exc:
            return session.FrameInvalid(exc)
        return session.FrameArrived(frame)

    async def _receive_text(self) -> str:
        while True:
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", CloseCode.NORMAL))
            text: str | None = message.get("text")
            limit = self._settings.max_frame_bytes
            if text is None:
                data = message.get("bytes") or b""
                if len(data) > limit:
                    log.info(
                        "closing a connection that sent a frame over the size limit (%d)",
                        CloseCode.TOO_LARGE,
                    )
                    await self._step(session.FrameTooLarge())
                    raise Closed()
                # Answered as any frame that does not parse: a first frame that is not a
                # hello closes the socket (`CloseCode.UNAUTHORIZED`), a later one gets its error.
                refused = ProtocolError(ErrorCode.BAD_REQUEST, "binary frames are not supported")
                await self._step(session.FrameInvalid(refused))
                continue
            if len(text) > limit or (len(text) * 4 > limit and len(text.encode()) > limit):
                log.info(
                    "closing a connection that sent a frame over the size limit (%d)",
                    CloseCode.TOO_LARGE,
                )
                await self._step(session.FrameTooLarge())
                raise Closed()
            return text

    async def _reader(self) -> None:
        while self._session.state is session.SessionState.OPEN:
            raw = await self._receive_text()
            wait_s = self._gate.admit()
            if wait_s:
                await self._refuse(raw, wait_s)
                continue
            event = self._parse(raw)
            if isinstance(event, session.FrameArrived) and isinstance(event.frame, protocol.Pong):
                self._gate.pong_is_free(admitted=True)
            try:
                await self._step(event)
            except (Closed, WebSocketDisconnect, asyncio.CancelledError):
                raise
            except Exception as exc:
                frame = event.frame if isinstance(event, session.FrameArrived) else None
                principal = self._session.principal
                await self.send_or_queue(self._requests.failure_reply(exc, frame, principal))
        raise Closed()

    async def _refuse(self, raw: str, wait_s: float) -> None:
        """A frame over the connection's rate: not handled, answered with `rate_limited`."""
        kind, ref = protocol.peek(raw)
        # Answering our heartbeat is not the client's traffic: it never costs a refusal.
        if kind == "pong" and self._gate.pong_is_free(admitted=False):
            return
        refusal = self._gate.refuse(wait_s)
        self._limits.refused("frames")
        if refusal.flooding:
            log.info("closing a connection that keeps sending after being rate limited")
        await self._step(session.RateExceeded(ref, refusal.retry_after_s, refusal.flooding))

    def _source(self) -> str | None:
        """The client's address, for the audit trail (uvicorn applies trusted proxy headers)."""
        client = self._ws.client
        return client.host if client else None

    # -- writing (the `Outlet` of gateway/transport/ws_watches.py)
    # ------------------------------------

    def try_send(self, text: str) -> bool:
        try:
            self._outbox.put_nowait(text)
        except asyncio.QueueFull:
            return False
        return True

    def send_live(self, text: str, committed: float) -> bool:
        """A subscription's live event: `try_send`, remembering when it was committed, or
        written at once when nothing waits before it (gateway/transport/socket_writer.py)."""
        if self._session.ending:
            return self.try_send(text)  # queued, then dropped with the rest on close
        return self._socket.offer_live(text, committed)

    def send_replay(self, text: str) -> Coroutine[Any, Any, None] | None:
        """A subscription's send: queued at once when there is room (None), else the wait.

        A replay sends hundreds of frames per page; with room in the queue, as usual, none of
        them needs a coroutine.
        """
        if not self._session.ending and self.try_send(text):
            return None
        return self._send_paced(text)

    async def _send_paced(self, text: str) -> None:
        """Wait for room in the bounded queue; a consumer that stalls is closed (`TOO_SLOW`).

        It loses nothing: every event is in the log and it resumes with `after_seq`.
        """
        if self._session.ending:
            raise Closed()
        # Room in the queue, the usual case: no timer task per frame, which a replay of a long
        # thread would otherwise pay for every event.
        if self.try_send(text):
            return
        try:
            await asyncio.wait_for(self._outbox.put(text), self._settings.send_timeout_s)
        except TimeoutError:
            log.info("closing a connection that stopped reading (outgoing queue full)")
            self.close_soon(CloseCode.TOO_SLOW)
            raise Closed() from None
        if self._session.ending:
            raise Closed()

    async def send_or_queue(self, frame: dict[str, Any]) -> None:
        await self._send_paced(protocol.encode(frame))

    async def _send_now(self, frame: dict[str, Any]) -> None:
        # Rare frames (handshake answers, a last error before closing): through Starlette,
        # which turns a vanished peer into `WebSocketDisconnect`.
        await self._ws.send_text(protocol.encode(frame))

    async def _writer(self) -> None:
        try:
            await self._socket.run()
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.close_soon(CloseCode.GOING_AWAY)

    def _beat_later(self) -> None:
        self._heartbeat = asyncio.get_running_loop().call_later(
            self._settings.heartbeat_s, self._beat
        )

    def _beat(self) -> None:
        # A full queue already proves the peer is behind; skipping a ping loses nothing.
        if self.try_send(PING):
            self._gate.ping_sent()
        self._beat_later()
