"""What one connection watches: its thread subscriptions and its approval inbox.

The connection passes itself as the `Outlet` these write to; access is checked when a watch
starts and again when a new hello changes the caller's roles.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from gateway.auth.access import AccessDenied, check_can_use_inbox
from gateway.event_log.logged_event import LoggedEvent
from gateway.event_log.subscription import ReplayCut, Subscription, resume_point
from gateway.protocol import frames as protocol
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import ErrorCode, GatewayError, rate_limited
from gateway.protocol.identity import Principal
from gateway.protocol.session import Closed, ConnectionSession
from gateway.resources import Services
from gateway.run_lifecycle.manager import ThreadRecord
from gateway.run_lifecycle.sensitive_arguments import frame_for
from gateway.storage.health import StorageUnavailable, log_failure
from gateway.transport.client_errors import client_error

log = logging.getLogger(__name__)


class Outlet(Protocol):
    """The connection's ways of sending (gateway/transport/ws_connection.py says how each waits)."""

    async def send_or_queue(self, frame: dict[str, Any]) -> None: ...

    def try_send(self, text: str) -> bool: ...

    def send_replay(self, text: str) -> Coroutine[Any, Any, None] | None: ...

    def send_live(self, text: str, committed: float) -> bool: ...

    def close_soon(self, code: CloseCode) -> None: ...


class Watches:
    def __init__(self, services: Services, outlet: Outlet, session: ConnectionSession) -> None:
        self._services = services
        self._outlet = outlet
        self._session = session
        self._subscriptions: dict[str, Subscription] = {}
        self._inbox_unsubscribe: Callable[[], None] | None = None
        self._threads_unsubscribe: Callable[[], None] | None = None
        # Which list the connection follows (`archived`), to follow it again under new roles.
        self._threads_archived = False

    def watching(self, thread_id: str | None) -> bool:
        return thread_id in self._subscriptions

    def check_subscription_slot(self) -> None:
        limits = self._services.limits
        if not limits.subscription_allowed(len(self._subscriptions)):
            limits.refused("subscriptions")
            limit = limits.settings.subscriptions_per_connection
            raise rate_limited(
                f"this connection already has {limit} thread subscriptions; unsubscribe first"
            )

    async def subscribe(
        self,
        principal: Principal,
        thread_id: str,
        after_seq: int,
        epoch: str | None,
        ref: str | None,
        *,
        quiet: bool = False,
        known: ThreadRecord | None = None,
        initial: Sequence[LoggedEvent] = (),
        quiet_since: int | None = None,
    ) -> None:
        """`known`: the thread as this process just wrote it; `initial`: stored events from
        `after_seq + 1` on, delivered before the subscription reads the log; `quiet_since`:
        the bus's publication count at which `initial` was all the thread had
        (`Started.quiet_since`): if it still is, the subscription reads nothing."""
        if not quiet and thread_id not in self._subscriptions:
            # Run starts checked this before starting (`admit_run`).
            self.check_subscription_slot()
        thread = await self._services.runs.authorize_subscribe(principal, thread_id, known)
        cursor, reset = resume_point(thread, after_seq, epoch)
        existing = self._subscriptions.pop(thread_id, None)
        if existing is not None:
            existing.close()
        outlet = self._outlet
        if not quiet and ref is not None:
            await outlet.send_or_queue(protocol.ack(ref, thread_id=thread_id))
        await outlet.send_or_queue(
            protocol.subscribed(thread_id, thread.epoch, thread.head_seq, reset)
        )
        subscription = Subscription(
            thread_id=thread_id,
            after_seq=cursor,
            bus=self._services.bus,
            log=self._services.log,
            send_replay=outlet.send_replay,
            send_live=outlet.send_live,
            metrics=self._services.metrics,
            reveal=self._reveal,
            omit=self._session.omitted_events,
        )
        self._subscriptions[thread_id] = subscription
        subscription.start(initial, caught_up=quiet_since == self._services.bus.publications)
        assert subscription.task is not None
        subscription.task.add_done_callback(self._subscription_ended)

    def unsubscribe(self, thread_id: str) -> None:
        subscription = self._subscriptions.pop(thread_id, None)
        if subscription is not None:
            subscription.close()

    async def subscribe_inbox(self, principal: Principal, ref: str | None) -> None:
        check_can_use_inbox(principal)
        if self._inbox_unsubscribe is not None:
            self._inbox_unsubscribe()
        buffered: list[tuple[list[dict[str, Any]], list[str]]] = []
        ready = False
        runs, outlet = self._services.runs, self._outlet

        def on_update(added: list[dict[str, Any]], removed: list[str]) -> None:
            # What this reader may do with each new approval (per-tool roles, four-eyes).
            added = runs.views.for_inbox_reader(principal, added)
            if not ready:
                buffered.append((added, removed))
                return
            if not outlet.try_send(protocol.encode(protocol.inbox_update(added, removed))):
                outlet.close_soon(CloseCode.TOO_SLOW)

        self._inbox_unsubscribe = self._services.bus.subscribe_inbox(principal.tenant, on_update)
        pending = await runs.views.inbox_views(principal)
        if ref is not None:
            await outlet.send_or_queue(protocol.ack(ref))
        await outlet.send_or_queue(protocol.inbox(pending))
        for added, removed in buffered:
            await outlet.send_or_queue(protocol.inbox_update(added, removed))
        ready = True

    async def subscribe_threads(
        self, principal: Principal, archived: bool, ref: str | None
    ) -> None:
        """The thread list as `principal` may see it, then its changes (`threads.subscribe`)."""
        if self._threads_unsubscribe is not None:
            self._threads_unsubscribe()
            self._threads_unsubscribe = None
        outlet = self._outlet
        buffered: list[dict[str, Any]] = []
        ready = False

        def send(frame: dict[str, Any]) -> None:
            if not ready:
                buffered.append(frame)
            elif not outlet.try_send(protocol.encode(frame)):
                outlet.close_soon(CloseCode.TOO_SLOW)

        self._threads_archived = archived
        snapshot, stop = await self._services.runs.thread_list.watch(
            principal,
            archived=archived,
            on_update=lambda views, removed: send(protocol.threads_update(views, removed)),
            on_snapshot=lambda views: send(protocol.threads(views)),
        )
        self._threads_unsubscribe = stop
        if ref is not None:
            await outlet.send_or_queue(protocol.ack(ref))
        await outlet.send_or_queue(protocol.threads(snapshot))
        for frame in buffered:
            await outlet.send_or_queue(frame)
        ready = True

    async def drop_lost_access(self, principal: Principal) -> None:
        """New roles apply to what is already watched: end what they no longer allow."""
        outlet = self._outlet
        if self._threads_unsubscribe is not None:
            # Which threads the list holds depends on the roles: it is sent again, whole.
            try:
                await self.subscribe_threads(principal, self._threads_archived, None)
            except GatewayError as exc:
                # A refusal ends the list; a fault or a storage outage is not the list's to
                # answer, and goes on up as any failed read does.
                if exc.fault or isinstance(exc, StorageUnavailable):
                    raise
                await outlet.send_or_queue(
                    protocol.error_frame(
                        None, ErrorCode(exc.code), f"thread list ended: {exc.message}"
                    )
                )
        if self._inbox_unsubscribe is not None:
            try:
                check_can_use_inbox(principal)
            except AccessDenied as exc:
                self._inbox_unsubscribe()
                self._inbox_unsubscribe = None
                await outlet.send_or_queue(
                    protocol.error_frame(
                        None, ErrorCode(exc.code), f"inbox subscription ended: {exc.message}"
                    )
                )
        for thread_id in list(self._subscriptions):
            try:
                await self._services.runs.authorize_subscribe(principal, thread_id)
                continue
            except GatewayError as exc:
                # Fail closed: access that cannot be confirmed (storage is down) is not kept.
                error = client_error(exc)
                if error is None:
                    raise
            self.unsubscribe(thread_id)
            retry = "; subscribe again" if error.code == ErrorCode.UNAVAILABLE else ""
            refusal = protocol.error_frame(
                None,
                error.code,
                f"subscription ended: {error.message}{retry}",
            )
            await outlet.send_or_queue(refusal | {"thread_id": thread_id})

    async def _reveal(self, event: LoggedEvent) -> str:
        """A masked `approval.requested`, as this connection may see it: with the real
        arguments for reviewers and admins. Checked at send time, as a new hello can change
        the connection's roles."""
        return await frame_for(self._session.principal, event, self._services.runs.approvals)

    def close_all(self) -> None:
        for subscription in self._subscriptions.values():
            subscription.close()
        self._subscriptions.clear()
        if self._inbox_unsubscribe is not None:
            self._inbox_unsubscribe()
        if self._threads_unsubscribe is not None:
            self._threads_unsubscribe()

    def _subscription_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None or isinstance(error, Closed):
            return
        # A subscription that cannot read the log must not leave its client waiting in
        # silence: close, and the client resumes from its cursor on reconnect (told `reset`
        # when retention cut the log under it).
        if isinstance(error, ReplayCut):
            log.info("closing a connection: %s", error)
        else:
            log_failure(log, error, "subscription failed; closing the connection")
        self._outlet.close_soon(CloseCode.INTERNAL)
