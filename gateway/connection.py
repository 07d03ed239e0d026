"""The WebSocket endpoint: hello/auth, a reader, a bounded writer, subscriptions.

A connection only *watches* runs: closing it unsubscribes and nothing else, so a socket never
decides a run's fate. Outgoing frames go through one bounded queue; a client too slow to drain
it during live streaming is closed with 4009 and catches up with `after_seq`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gateway import protocol
from gateway.auth import AccessDenied, AuthError, Principal, check_can_use_inbox
from gateway.errors import GatewayError
from gateway.execution import approval_view
from gateway.protocol import ErrorCode, ProtocolError
from gateway.services import Services
from gateway.subscription import Subscription
from persistence.errors import StorageUnavailable

log = logging.getLogger(__name__)

CLOSE_UNAUTHORIZED = 4001
CLOSE_TOO_SLOW = 4009
CLOSE_TOO_LARGE = 1009
CLOSE_GOING_AWAY = 1001
CLOSE_RESTART = 1012
CLOSE_INTERNAL = 1011
# How long a close frame may wait behind unread data before the connection is dropped.
CLOSE_TIMEOUT_S = 10.0


class Closed(Exception):
    """The connection is over; stop reading."""


class Connection:
    def __init__(self, websocket: WebSocket, services: Services) -> None:
        self._ws = websocket
        self._services = services
        self._settings = services.settings
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue(self._settings.send_queue_size)
        self._subscriptions: dict[str, Subscription] = {}
        self._principal: Principal | None = None
        self._close_code: int | None = None
        self._inbox_unsubscribe: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def serve(self) -> None:
        await self._ws.accept()
        self._services.connections.add(self)
        try:
            if not await self._handshake():
                return
            self._tasks.append(asyncio.create_task(self._writer(), name="ws-writer"))
            self._tasks.append(asyncio.create_task(self._heartbeat(), name="ws-heartbeat"))
            await self._reader()
        except (WebSocketDisconnect, Closed):
            pass
        finally:
            self._services.connections.discard(self)
            await self._cleanup()

    async def _cleanup(self) -> None:
        for subscription in self._subscriptions.values():
            subscription.close()
        self._subscriptions.clear()
        if self._inbox_unsubscribe is not None:
            self._inbox_unsubscribe()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._closing is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._closing), CLOSE_TIMEOUT_S)
        await self._close(self._close_code or 1000)

    async def _close(self, code: int) -> None:
        if self._ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await self._ws.close(code)

    def close_soon(self, code: int) -> None:
        """Close from outside the reader (overflow, shutdown): stop the reader and writer."""
        if self._close_code is None:
            self._close_code = code
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

    # -- handshake -------------------------------------------------------------------------

    async def _handshake(self) -> bool:
        try:
            raw = await asyncio.wait_for(self._receive_text(), self._settings.hello_timeout_s)
        except TimeoutError:
            await self._send_direct(
                protocol.error_frame(None, ErrorCode.UNAUTHORIZED, "no hello within the timeout")
            )
            self._close_code = CLOSE_UNAUTHORIZED
            return False
        try:
            frame = protocol.parse_client_frame(raw, max_input_chars=self._settings.max_input_chars)
        except ProtocolError as exc:
            await self._send_direct(exc.to_frame())
            self._close_code = CLOSE_UNAUTHORIZED
            return False
        if not isinstance(frame, protocol.Hello):
            await self._send_direct(
                protocol.error_frame(
                    frame.id, ErrorCode.UNAUTHORIZED, "the first frame must be hello"
                )
            )
            self._close_code = CLOSE_UNAUTHORIZED
            return False
        if frame.protocol != protocol.PROTOCOL_VERSION:
            await self._send_direct(
                protocol.error_frame(
                    frame.id,
                    ErrorCode.UNSUPPORTED_PROTOCOL,
                    f"protocol {frame.protocol} is not supported; this server speaks "
                    f"{protocol.PROTOCOL_VERSION}",
                )
            )
            self._close_code = CLOSE_UNAUTHORIZED
            return False
        try:
            principal = self._services.verifier.verify(frame.token)
        except AuthError as exc:
            await self._send_direct(
                protocol.error_frame(frame.id, ErrorCode.UNAUTHORIZED, exc.message)
            )
            self._close_code = CLOSE_UNAUTHORIZED
            return False
        self._principal = principal
        await self._send_direct(
            protocol.welcome(
                user=principal.user,
                tenant=principal.tenant,
                roles=sorted(principal.roles),
                heartbeat_s=self._settings.heartbeat_s,
                server_name=self._services.server_name,
                server_version=self._services.server_version,
            )
        )
        return True

    async def _receive_text(self) -> str:
        while True:
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            text = message.get("text")
            if text is None:
                data = message.get("bytes") or b""
                if len(data) > self._settings.max_frame_bytes:
                    self._close_code = CLOSE_TOO_LARGE
                    raise Closed()
                await self._send_or_queue(
                    protocol.error_frame(
                        None, ErrorCode.BAD_REQUEST, "binary frames are not supported"
                    )
                )
                continue
            if len(text) > self._settings.max_frame_bytes or (
                len(text) * 4 > self._settings.max_frame_bytes
                and len(text.encode()) > self._settings.max_frame_bytes
            ):
                self._close_code = CLOSE_TOO_LARGE
                raise Closed()
            return text

    # -- reading and dispatch --------------------------------------------------------------

    async def _reader(self) -> None:
        while True:
            raw = await self._receive_text()
            ref: str | None = None
            try:
                frame = protocol.parse_client_frame(
                    raw, max_input_chars=self._settings.max_input_chars
                )
                ref = frame.id
                reply = await self._dispatch(frame)
            except ProtocolError as exc:
                reply = exc.to_frame()
            except GatewayError as exc:
                reply = protocol.error_frame(ref, exc.code, exc.message)  # type: ignore[arg-type]
            except StorageUnavailable:
                reply = protocol.error_frame(
                    ref, ErrorCode.UNAVAILABLE, "storage is unavailable; nothing was changed"
                )
            except (Closed, WebSocketDisconnect, asyncio.CancelledError):
                raise
            except Exception:
                log.error("frame handling failed", exc_info=True)
                reply = protocol.error_frame(ref, ErrorCode.INTERNAL, "internal error")
            if reply is not None:
                if reply.get("type") == "ack" and ref is None:
                    continue  # frames without an id get no ack (PROTOCOL §2)
                await self._send_or_queue(reply)

    async def _dispatch(self, frame: Any) -> dict[str, Any] | None:
        principal = self._principal
        assert principal is not None
        runs = self._services.runs
        ref = frame.id
        match frame:
            case protocol.Ping():
                return protocol.pong() | ({"ref": ref} if ref else {})
            case protocol.Pong():
                return None
            case protocol.Hello():
                raise ProtocolError(ErrorCode.BAD_REQUEST, "already authenticated", ref)
            case protocol.ThreadCreate():
                thread = await runs.create_thread(principal, frame.metadata)
                return protocol.ack(ref, thread_id=thread.thread_id, epoch=thread.epoch)
            case protocol.ThreadSubscribe():
                await self._subscribe(frame.thread_id, frame.after_seq, frame.epoch, ref)
                return None
            case protocol.ThreadUnsubscribe():
                subscription = self._subscriptions.pop(frame.thread_id, None)
                if subscription is not None:
                    subscription.close()
                return protocol.ack(ref, thread_id=frame.thread_id)
            case protocol.RunStart():
                started = await runs.start_run(
                    principal,
                    thread_id=frame.thread_id,
                    text=frame.input,
                    agent=frame.agent,
                    on_disconnect=frame.on_disconnect,
                )
                if ref is not None:
                    await self._send_or_queue(
                        protocol.ack(ref, thread_id=started.thread_id, run_id=started.run_id)
                    )
                if started.thread_id not in self._subscriptions:
                    await self._subscribe(
                        started.thread_id, started.first_seq - 1, None, None, quiet=True
                    )
                return None
            case protocol.RunInput():
                result = await runs.submit_input(principal, frame.thread_id, frame.input)
                first_seq = result.pop("first_seq", None)
                if ref is not None:
                    await self._send_or_queue(protocol.ack(ref, **result))
                if first_seq is not None and frame.thread_id not in self._subscriptions:
                    await self._subscribe(frame.thread_id, first_seq - 1, None, None, quiet=True)
                return None
            case protocol.ApprovalDecide():
                approval = await runs.decide(
                    principal, frame.approval_id, frame.decision, frame.reason
                )
                return protocol.ack(ref, approval=approval_view(approval))
            case protocol.RunCancel():
                await runs.cancel(principal, frame.run_id)
                return protocol.ack(ref, run_id=frame.run_id)
            case protocol.RunResume():
                await runs.resume(principal, frame.run_id)
                return protocol.ack(ref, run_id=frame.run_id)
            case protocol.InboxSubscribe():
                await self._subscribe_inbox(ref)
                return None
        raise ProtocolError(ErrorCode.BAD_REQUEST, "unsupported frame", ref)

    # -- subscriptions ---------------------------------------------------------------------

    async def _subscribe(
        self,
        thread_id: str,
        after_seq: int,
        epoch: str | None,
        ref: str | None,
        *,
        quiet: bool = False,
    ) -> None:
        principal = self._principal
        assert principal is not None
        thread = await self._services.runs.authorize_subscribe(principal, thread_id)
        reset = (
            (epoch is not None and epoch != thread.epoch)
            or after_seq > thread.head_seq
            # Retention removed events the client has not seen: it must rebuild its view.
            or after_seq < thread.truncated_seq
        )
        cursor = 0 if reset else after_seq
        existing = self._subscriptions.pop(thread_id, None)
        if existing is not None:
            existing.close()
        if not quiet and ref is not None:
            await self._send_or_queue(protocol.ack(ref, thread_id=thread_id))
        await self._send_or_queue(
            protocol.subscribed(thread_id, thread.epoch, thread.head_seq, reset)
        )
        subscription = Subscription(
            thread_id=thread_id,
            after_seq=cursor,
            bus=self._services.bus,
            log=self._services.log,
            send_replay=self._send_paced,
            send_live=self._try_send,
        )
        self._subscriptions[thread_id] = subscription
        subscription.start()
        assert subscription.task is not None
        subscription.task.add_done_callback(self._subscription_ended)

    async def _subscribe_inbox(self, ref: str | None) -> None:
        principal = self._principal
        assert principal is not None
        try:
            check_can_use_inbox(principal)
        except AccessDenied as exc:
            raise GatewayError(exc.code, exc.message) from None
        if self._inbox_unsubscribe is not None:
            self._inbox_unsubscribe()
        buffered: list[tuple[list[dict[str, Any]], list[str]]] = []
        ready = False

        def on_update(added: list[dict[str, Any]], removed: list[str]) -> None:
            if not ready:
                buffered.append((added, removed))
                return
            if not self._try_send(protocol.encode(protocol.inbox_update(added, removed))):
                self.close_soon(CLOSE_TOO_SLOW)

        self._inbox_unsubscribe = self._services.bus.subscribe_inbox(principal.tenant, on_update)
        pending = await self._services.runs.approvals.pending_for_tenant(principal.tenant)
        if ref is not None:
            await self._send_or_queue(protocol.ack(ref))
        await self._send_or_queue(protocol.inbox([approval_view(a) for a in pending]))
        for added, removed in buffered:
            await self._send_or_queue(protocol.inbox_update(added, removed))
        ready = True

    def _subscription_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None or isinstance(error, Closed):
            return
        # A subscription that cannot read the log must not leave its client waiting in
        # silence: close, and the client resumes from its cursor on reconnect.
        log.error("subscription failed; closing the connection", exc_info=error)
        self.close_soon(CLOSE_INTERNAL)

    # -- writing ---------------------------------------------------------------------------

    def _try_send(self, text: str) -> bool:
        try:
            self._outbox.put_nowait(text)
        except asyncio.QueueFull:
            return False
        return True

    async def _send_paced(self, text: str) -> None:
        """Wait for room in the bounded queue; a consumer that stalls is closed with 4009.

        It loses nothing: every event is in the log and it resumes with `after_seq`.
        """
        if self._close_code is not None:
            raise Closed()
        try:
            await asyncio.wait_for(self._outbox.put(text), self._settings.send_timeout_s)
        except TimeoutError:
            log.info("closing a connection that stopped reading (outgoing queue full)")
            self.close_soon(CLOSE_TOO_SLOW)
            raise Closed() from None
        if self._close_code is not None:
            raise Closed()

    async def _send_or_queue(self, frame: dict[str, Any]) -> None:
        await self._send_paced(protocol.encode(frame))

    async def _send_direct(self, frame: dict[str, Any]) -> None:
        await self._ws.send_text(protocol.encode(frame))

    async def _writer(self) -> None:
        try:
            while True:
                text = await self._outbox.get()
                if text is None:
                    return
                await self._ws.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.close_soon(CLOSE_GOING_AWAY)

    async def _heartbeat(self) -> None:
        ping = protocol.encode(protocol.ping())
        while True:
            await asyncio.sleep(self._settings.heartbeat_s)
            # A full queue already proves the peer is behind; skipping a ping loses nothing.
            self._try_send(ping)
