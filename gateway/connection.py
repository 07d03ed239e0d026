"""The WebSocket endpoint: hello/auth, a reader, a bounded writer, subscriptions.

A connection only *watches* runs: closing it unsubscribes and nothing else, so a socket never
decides a run's fate. Outgoing frames go through one queue bounded in frames and in bytes
(gateway/outbox.py); a client too slow to drain it during live streaming is closed with
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
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from starlette.types import Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gateway import protocol
from gateway.audit import DENIAL_CODES, Transport
from gateway.auth import AccessDenied, AuthError, AuthUnavailable, Principal, check_can_use_inbox
from gateway.close_codes import CloseCode
from gateway.errors import GatewayError, close_code_for, rate_limited, storage_unavailable
from gateway.eventlog_types import LoggedEvent
from gateway.limits import ConnectionSlot
from gateway.outbox import Outbox
from gateway.protocol import ErrorCode, ProtocolError
from gateway.runs import ThreadRecord
from gateway.sensitive import frame_for
from gateway.server_limits import CLOSE_TIMEOUT_S
from gateway.services import Services
from gateway.socket_writer import SocketWriter
from gateway.storage_health import StorageUnavailable, log_failure
from gateway.subscription import Subscription, resume_point

log = logging.getLogger(__name__)


class Closed(Exception):
    """The connection is over; stop reading."""


class Connection:
    def __init__(self, websocket: WebSocket, services: Services, send: Send | None = None) -> None:
        self._ws = websocket
        # The writer's frames go out through the raw ASGI `send` when given
        # (gateway/ws_endpoint.py says why); the handshake and the close go through `websocket`.
        self._send_message: Send = send if send is not None else websocket.send
        self._services = services
        self._settings = services.settings
        self._outbox = Outbox(self._settings.send_queue_size, self._settings.send_queue_bytes)
        self._socket = SocketWriter(
            self._outbox,
            self._send_message,
            websocket.scope if send is not None else None,
            services.metrics.delivered if services.metrics is not None else None,
        )
        self._subscriptions: dict[str, Subscription] = {}
        self._principal: Principal | None = None
        self._close_code: int | None = None
        self._inbox_unsubscribe: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing: asyncio.Task[None] | None = None
        # Closes the connection when the current token expires; moved by a new hello.
        self._expiry: asyncio.Task[None] | None = None
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
            if not await self._handshake():
                return
            self._tasks.append(asyncio.create_task(self._writer(), name="ws-writer"))
            self._tasks.append(asyncio.create_task(self._heartbeat(), name="ws-heartbeat"))
            assert self._principal is not None
            self._watch_expiry(self._principal)
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
        await self._close(self._close_code or CloseCode.NORMAL)
        log.debug("connection closed (%d)", self._close_code or CloseCode.NORMAL)

    async def _close(self, code: int) -> None:
        if self._ws.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await self._ws.close(code)

    def close_soon(self, code: int) -> None:
        """Close from outside the reader (overflow, shutdown): stop the reader and writer."""
        if self._close_code is None:
            self._close_code = code
            if code == CloseCode.TOO_SLOW and self._metrics is not None:
                self._metrics.slow_closes.inc()
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
            await self._send_now(
                protocol.error_frame(None, ErrorCode.UNAUTHORIZED, "no hello within the timeout")
            )
            self._close_code = close_code_for(ErrorCode.UNAUTHORIZED)
            return False
        try:
            frame = protocol.parse_client_frame(raw, max_input_chars=self._settings.max_input_chars)
        except ProtocolError as exc:
            await self._send_now(exc.to_frame())
            self._close_code = close_code_for(exc.code)
            return False
        if not isinstance(frame, protocol.Hello):
            await self._send_now(
                protocol.error_frame(
                    frame.id, ErrorCode.UNAUTHORIZED, "the first frame must be hello"
                )
            )
            self._close_code = close_code_for(ErrorCode.UNAUTHORIZED)
            return False
        if frame.protocol != protocol.PROTOCOL_VERSION:
            await self._send_now(
                protocol.error_frame(
                    frame.id,
                    ErrorCode.UNSUPPORTED_PROTOCOL,
                    f"protocol {frame.protocol} is not supported; this server speaks "
                    f"{protocol.PROTOCOL_VERSION}",
                )
            )
            self._close_code = close_code_for(ErrorCode.UNSUPPORTED_PROTOCOL)
            return False
        try:
            principal = await self._services.verifier.authenticate(frame.token)
        except AuthError as exc:
            if not isinstance(exc, AuthUnavailable):
                self._services.audit.token_rejected(
                    source=self._source(), transport=Transport.WS, message=exc.message
                )
            await self._send_now(protocol.error_frame(frame.id, exc.code, exc.message))
            # `unauthorized`, or `unavailable` when the identity provider's keys were not
            # fetched: the table tells them apart.
            self._close_code = close_code_for(exc.code)
            return False
        try:
            slot = self._limits.open_connection(principal.tenant, principal.user)
        except GatewayError as exc:
            await self._send_now(
                protocol.error_frame(frame.id, ErrorCode.RATE_LIMITED, exc.message)
            )
            self._close_code = close_code_for(exc.code)
            return False
        self._slot = slot
        self._principal = principal = dataclasses.replace(principal, source=self._source())
        await self._send_now(self._welcome(principal))
        return True

    def _welcome(self, principal: Principal) -> dict[str, Any]:
        return protocol.welcome(
            user=principal.user,
            tenant=principal.tenant,
            roles=sorted(principal.roles),
            heartbeat_s=self._settings.heartbeat_s,
            server_name=self._services.server_name,
            server_version=self._services.server_version,
        )

    # -- token lifetime --------------------------------------------------------------------

    def _watch_expiry(self, principal: Principal) -> None:
        """Arm the close at the token's expiry (plus leeway), replacing any earlier one."""
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(ValueError):
                self._tasks.remove(self._expiry)
            self._expiry = None
        if principal.expires_at is None:
            return
        deadline = principal.expires_at + self._services.verifier.leeway_s
        self._expiry = asyncio.create_task(self._expire_at(deadline), name="ws-token-expiry")
        self._tasks.append(self._expiry)

    async def _expire_at(self, deadline: float) -> None:
        # `exp` is wall-clock time; the sleep itself runs on the loop's monotonic clock.
        await asyncio.sleep(max(0.0, deadline - time.time()))
        await self._end_with(
            protocol.error_frame(
                None,
                ErrorCode.UNAUTHORIZED,
                "token has expired; send a new hello with a fresh token before it expires",
            ),
            close_code_for(ErrorCode.UNAUTHORIZED),
        )

    async def _reauthenticate(self, frame: protocol.Hello) -> dict[str, Any] | None:
        """A later hello renews the connection's token: same user and tenant, new roles and
        expiry, answered with a new `welcome`. A refusal ends the connection like a failed
        first hello, except `unavailable`: the current token still holds, so the client may
        retry."""
        current = self._principal
        assert current is not None
        ref = frame.id
        if frame.protocol != protocol.PROTOCOL_VERSION:
            message = (
                f"protocol {frame.protocol} is not supported; this server speaks "
                f"{protocol.PROTOCOL_VERSION}"
            )
            await self._end_with(
                protocol.error_frame(ref, ErrorCode.UNSUPPORTED_PROTOCOL, message),
                close_code_for(ErrorCode.UNSUPPORTED_PROTOCOL),
            )
            raise Closed()
        try:
            principal = await self._services.verifier.authenticate(frame.token)
        except AuthUnavailable as exc:
            return protocol.error_frame(ref, ErrorCode.UNAVAILABLE, exc.message)
        except AuthError as exc:
            self._services.audit.token_rejected(
                source=current.source, transport=Transport.WS, message=exc.message
            )
            await self._end_with(
                protocol.error_frame(ref, ErrorCode.UNAUTHORIZED, exc.message),
                close_code_for(ErrorCode.UNAUTHORIZED),
            )
            raise Closed() from None
        if (principal.user, principal.tenant) != (current.user, current.tenant):
            # Subscriptions, the connection slot and runs started here belong to the first
            # identity: switching identity needs a new connection.
            await self._end_with(
                protocol.error_frame(
                    ref,
                    ErrorCode.UNAUTHORIZED,
                    "a new hello must carry a token for the same user and tenant",
                ),
                close_code_for(ErrorCode.UNAUTHORIZED),
            )
            raise Closed()
        if self._close_code is not None:
            # The old token expired (or the connection began closing) during the check.
            raise Closed()
        principal = dataclasses.replace(principal, source=current.source)
        self._principal = principal
        self._watch_expiry(principal)
        await self._send_or_queue(self._welcome(principal) | ({"ref": ref} if ref else {}))
        if (principal.roles, principal.extra_roles) != (current.roles, current.extra_roles):
            await self._drop_lost_access(principal)
        return None

    async def _drop_lost_access(self, principal: Principal) -> None:
        """New roles apply to what is already watched: end what they no longer allow."""
        if self._inbox_unsubscribe is not None:
            try:
                check_can_use_inbox(principal)
            except AccessDenied as exc:
                self._inbox_unsubscribe()
                self._inbox_unsubscribe = None
                await self._send_or_queue(
                    protocol.error_frame(
                        None, ErrorCode(exc.code), f"inbox subscription ended: {exc.message}"
                    )
                )
        for thread_id in list(self._subscriptions):
            try:
                await self._services.runs.authorize_subscribe(principal, thread_id)
                continue
            except GatewayError as exc:
                code, message = exc.code, exc.message
            except StorageUnavailable:
                # Fail closed: access that cannot be confirmed is not kept.
                code, message = ErrorCode.UNAVAILABLE, "storage is unavailable; subscribe again"
            subscription = self._subscriptions.pop(thread_id, None)
            if subscription is not None:
                subscription.close()
            refusal = protocol.error_frame(
                None,
                code,  # type: ignore[arg-type]
                f"subscription ended: {message}",
            )
            await self._send_or_queue(refusal | {"thread_id": thread_id})

    async def _end_with(self, frame: dict[str, Any], code: int) -> None:
        """Send `frame` as the connection's last word, then close with `code`.

        Queued frames are dropped: they were meant for an authentication that no longer holds.
        """
        if self._close_code is not None:
            return
        self._close_code = code
        current = asyncio.current_task()
        others = [task for task in self._tasks if task is not current]
        for task in others:
            task.cancel()
        # The writer must have stopped before writing directly: two senders could interleave.
        await asyncio.gather(*others, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._send_now(frame), CLOSE_TIMEOUT_S)
        self.close_soon(code)

    async def _receive_text(self) -> str:
        while True:
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", CloseCode.NORMAL))
            text = message.get("text")
            if text is None:
                data = message.get("bytes") or b""
                if len(data) > self._settings.max_frame_bytes:
                    self._close_code = CloseCode.TOO_LARGE
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
                self._close_code = CloseCode.TOO_LARGE
                raise Closed()
            return text

    # -- reading and dispatch --------------------------------------------------------------

    async def _reader(self) -> None:
        while True:
            raw = await self._receive_text()
            wait_s = self._gate.admit()
            if wait_s:
                await self._refuse(raw, wait_s)
                continue
            ref: str | None = None
            frame: Any = None
            try:
                frame = protocol.parse_client_frame(
                    raw, max_input_chars=self._settings.max_input_chars
                )
                ref = frame.id
                if isinstance(frame, protocol.Pong):
                    self._gate.pong_is_free(admitted=True)
                reply = await self._dispatch(frame)
            except ProtocolError as exc:
                reply = exc.to_frame()
            except GatewayError as exc:
                self._note_denial(frame, exc)
                reply = protocol.error_frame(ref, exc.code, exc.message)  # type: ignore[arg-type]
                reply |= exc.fields
            except StorageUnavailable:
                outage = storage_unavailable()
                reply = protocol.error_frame(ref, outage.code, outage.message)
            except (Closed, WebSocketDisconnect, asyncio.CancelledError):
                raise
            except Exception:
                log.error("frame handling failed", exc_info=True)
                reply = protocol.error_frame(ref, ErrorCode.INTERNAL, "internal error")
            if reply is not None:
                if reply.get("type") == "ack" and ref is None:
                    continue  # frames without an id get no ack (docs/protocol.md §2)
                await self._send_or_queue(reply)

    async def _reveal(self, event: LoggedEvent) -> str:
        """A masked `approval.requested`, as this connection may see it: with the real
        arguments for reviewers and admins. Checked at send time, as a new hello can change
        the connection's roles."""
        return await frame_for(self._principal, event, self._services.runs.approvals)

    def _source(self) -> str | None:
        """The client's address, for the audit trail (uvicorn applies trusted proxy headers)."""
        client = self._ws.client
        return client.host if client else None

    def _note_denial(self, frame: Any, exc: GatewayError) -> None:
        """Audit a `forbidden` / `not_found` answer to an authenticated caller's frame."""
        if exc.code not in DENIAL_CODES or self._principal is None or frame is None:
            return
        target = next(
            (
                value
                for name in ("approval_id", "run_id", "thread_id")
                if isinstance(value := getattr(frame, name, None), str)
            ),
            None,
        )
        self._services.audit.access_denied(
            self._principal,
            code=exc.code,
            operation=str(getattr(frame, "type", "unknown")),
            target=target,
            transport=Transport.WS,
        )

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
            self._close_code = CloseCode.FLOODING
            raise Closed()
        frame = protocol.error_frame(
            ref, ErrorCode.RATE_LIMITED, "too many frames on this connection; slow down"
        )
        await self._send_or_queue(frame | {"retry_after_s": refusal.retry_after_s})

    def _admit_run(self, thread_id: str | None) -> Callable[[], None]:
        """Vets a run start once the request is valid (see `RunManager.start_run`)."""
        principal = self._principal
        assert principal is not None

        def admit() -> None:
            # The new run's thread gets subscribed: refuse before starting what we could not
            # show. Checked first, as it costs the user nothing.
            if thread_id not in self._subscriptions:
                self._check_subscription_slot()
            self._limits.admit_run_start(principal.tenant, principal.user)

        return admit

    def _check_subscription_slot(self) -> None:
        if not self._limits.subscription_allowed(len(self._subscriptions)):
            self._limits.refused("subscriptions")
            limit = self._limits.settings.subscriptions_per_connection
            raise rate_limited(
                f"this connection already has {limit} thread subscriptions; unsubscribe first"
            )

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
                return await self._reauthenticate(frame)
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
                    admit=self._admit_run(frame.thread_id),
                )
                if ref is not None:
                    await self._send_or_queue(
                        protocol.ack(ref, thread_id=started.thread_id, run_id=started.run_id)
                    )
                if started.thread_id not in self._subscriptions:
                    # The run's first commit gave the thread and `run.started`: nothing to read
                    # before the caller sees its run begin.
                    await self._subscribe(
                        started.thread_id,
                        started.first_seq - 1,
                        None,
                        None,
                        quiet=True,
                        known=started.thread,
                        initial=started.events,
                    )
                return None
            case protocol.RunInput():
                result = await runs.submit_input(
                    principal,
                    frame.thread_id,
                    frame.input,
                    admit=self._admit_run(frame.thread_id),
                    max_pending=self._limits.pending_inputs_per_thread,
                )
                first_seq = result.pop("first_seq", None)
                if ref is not None:
                    await self._send_or_queue(protocol.ack(ref, **result))
                if first_seq is not None and frame.thread_id not in self._subscriptions:
                    await self._subscribe(frame.thread_id, first_seq - 1, None, None, quiet=True)
                return None
            case protocol.ApprovalDecide():
                approval = await runs.decisions.decide(
                    principal, frame.approval_id, frame.decision, frame.reason
                )
                return protocol.ack(
                    ref, approval=await runs.views.view_approval(principal, approval)
                )
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
        known: ThreadRecord | None = None,
        initial: Sequence[LoggedEvent] = (),
    ) -> None:
        """`known`: the thread as this process just wrote it; `initial`: stored events from
        `after_seq + 1` on, delivered before the subscription reads the log."""
        principal = self._principal
        assert principal is not None
        if not quiet and thread_id not in self._subscriptions:
            # Run starts checked this before starting (`_admit_run`).
            self._check_subscription_slot()
        thread = await self._services.runs.authorize_subscribe(principal, thread_id, known)
        cursor, reset = resume_point(thread, after_seq, epoch)
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
            send_replay=self._send_replay,
            send_live=self._send_live,
            metrics=self._metrics,
            reveal=self._reveal,
        )
        self._subscriptions[thread_id] = subscription
        subscription.start(initial)
        assert subscription.task is not None
        subscription.task.add_done_callback(self._subscription_ended)

    async def _subscribe_inbox(self, ref: str | None) -> None:
        principal = self._principal
        assert principal is not None
        check_can_use_inbox(principal)
        if self._inbox_unsubscribe is not None:
            self._inbox_unsubscribe()
        buffered: list[tuple[list[dict[str, Any]], list[str]]] = []
        ready = False

        runs = self._services.runs

        def on_update(added: list[dict[str, Any]], removed: list[str]) -> None:
            # What this reader may do with each new approval (per-tool roles, four-eyes).
            added = runs.views.for_inbox_reader(principal, added)
            if not ready:
                buffered.append((added, removed))
                return
            if not self._try_send(protocol.encode(protocol.inbox_update(added, removed))):
                self.close_soon(CloseCode.TOO_SLOW)

        self._inbox_unsubscribe = self._services.bus.subscribe_inbox(principal.tenant, on_update)
        pending = await runs.views.inbox_views(principal)
        if ref is not None:
            await self._send_or_queue(protocol.ack(ref))
        await self._send_or_queue(protocol.inbox(pending))
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
        log_failure(log, error, "subscription failed; closing the connection")
        self.close_soon(CloseCode.INTERNAL)

    # -- writing ---------------------------------------------------------------------------

    def _try_send(self, text: str) -> bool:
        try:
            self._outbox.put_nowait(text)
        except asyncio.QueueFull:
            return False
        return True

    def _send_live(self, text: str, committed: float) -> bool:
        """A subscription's live event: `_try_send`, remembering when it was committed, or
        written at once when nothing waits before it (gateway/socket_writer.py)."""
        if self._close_code is not None:
            return self._try_send(text)  # queued, then dropped with the rest on close
        return self._socket.offer_live(text, committed)

    def _send_replay(self, text: str) -> Coroutine[Any, Any, None] | None:
        """A subscription's send: queued at once when there is room (None), else the wait.

        A replay sends hundreds of frames per page; with room in the queue, as usual, none of
        them needs a coroutine.
        """
        if self._close_code is None:
            try:
                self._outbox.put_nowait(text)
                return None
            except asyncio.QueueFull:
                pass
        return self._send_paced(text)

    async def _send_paced(self, text: str) -> None:
        """Wait for room in the bounded queue; a consumer that stalls is closed (`TOO_SLOW`).

        It loses nothing: every event is in the log and it resumes with `after_seq`.
        """
        if self._close_code is not None:
            raise Closed()
        try:
            # Room in the queue, the usual case: no timer task per frame, which a replay of a
            # long thread would otherwise pay for every event.
            self._outbox.put_nowait(text)
            return
        except asyncio.QueueFull:
            pass
        try:
            await asyncio.wait_for(self._outbox.put(text), self._settings.send_timeout_s)
        except TimeoutError:
            log.info("closing a connection that stopped reading (outgoing queue full)")
            self.close_soon(CloseCode.TOO_SLOW)
            raise Closed() from None
        if self._close_code is not None:
            raise Closed()

    async def _send_or_queue(self, frame: dict[str, Any]) -> None:
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

    async def _heartbeat(self) -> None:
        ping = protocol.encode(protocol.ping())
        while True:
            await asyncio.sleep(self._settings.heartbeat_s)
            # A full queue already proves the peer is behind; skipping a ping loses nothing.
            if self._try_send(ping):
                self._gate.ping_sent()
