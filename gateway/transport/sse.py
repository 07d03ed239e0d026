"""A thread's events as Server-Sent Events (docs/protocol.md §8): `thread.subscribe` over HTTP.

The feed is the WebSocket subscription itself (`Subscription`: replay from a cursor, then live,
every seq once and in order) with the same access check (`authorize_subscribe`) and the same
resume rule (`resume_point`), written out as SSE messages instead of frames:

- the first message is `event: subscribed` with the `subscribed` frame (`epoch`, `head_seq`,
  `reset`), so a client whose cursor no longer fits (another epoch, past the head, cut by
  retention) is told to drop its view, exactly as on the WebSocket;
- every event is a message whose `id` is its `seq` and whose data is the `event` frame, so a
  client's `Last-Event-ID` on reconnect is its cursor: no gap and no repeat;
- a comment line every `GATEWAY_HEARTBEAT_S` keeps proxies from closing an idle feed and lets
  the server notice a client that has gone;
- a feed the gateway ends (the token expired, the client fell behind, a shutdown) ends with
  `event: end`, whose data names the WebSocket close code of the same case
  (gateway/transport/feed_response.py); the client reconnects with its Last-Event-ID.

The frames wait in a queue bounded in frames and in bytes, like a WebSocket's
(gateway/transport/outbox.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.abuse.limits import ConnectionSlot
from gateway.auth.access import check_can_use_inbox
from gateway.event_log.logged_event import LoggedEvent
from gateway.event_log.subscription import Subscription, resume_point
from gateway.protocol import frames as protocol
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.protocol.frames import MAX_ID_CHARS
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.run_lifecycle.sensitive_arguments import frame_for
from gateway.transport.feed_response import END_MESSAGES, FeedEnded, FeedResponse
from gateway.transport.http_api import authenticate, endpoint, int_value, path_id
from gateway.transport.outbox import Outbox

log = logging.getLogger(__name__)

MAX_AFTER = 2**62
# How long a browser's EventSource waits before reconnecting after the feed ends.
RETRY_MS = 1000
HEARTBEAT = b": heartbeat\n\n"
# Queued in place of a frame that did not fit, by a feed with no cursor to resume from: the
# feed ends there (`put_or_overflow`).
OVERFLOW = ""
# Queued when the task filling a feed's queue has ended: the feed ends once it has sent what
# came before.
SOURCE_ENDED = " "


def sse_message(data: str, *, event: str | None = None, event_id: int | None = None) -> bytes:
    # Frames are compact JSON (no newlines), so each is one `data:` line.
    head = f"event: {event}\n" if event else ""
    if event_id is not None:
        head += f"id: {event_id}\n"
    return f"{head}data: {data}\n\n".encode()


def end_event(code: CloseCode) -> bytes:
    """The last message of a feed the gateway ends (gateway/transport/feed_response.py)."""
    data = {"type": "end", "code": int(code), "message": END_MESSAGES[code]}
    return sse_message(orjson.dumps(data).decode(), event="end")


def feed_response(
    body: AsyncIterator[bytes], slot: ConnectionSlot, services: Services, principal: Principal
) -> FeedResponse:
    return FeedResponse(body, slot, services=services, principal=principal, last_word=end_event)


async def feed_frames(
    services: Services,
    queue: Outbox,
    *,
    source: asyncio.Task[None] | None = None,
) -> AsyncIterator[str | None]:
    """The queued frames, and None whenever a heartbeat is due. The feed ends (`FeedEnded`)
    at an `OVERFLOW`, as too slow, and once `source`, the task that fills the queue, has ended
    and what it queued is sent: it ends only when it could not read the log. (The token's
    expiry ends the response: `FeedResponse`.)"""
    heartbeat_s = services.settings.heartbeat_s
    if source is not None:
        source.add_done_callback(lambda _: _wake(queue))
    while True:
        if source is not None and source.done() and queue.empty():
            log.info("ending a feed whose subscription could not read the log")
            raise FeedEnded(CloseCode.INTERNAL)
        try:
            frame = await asyncio.wait_for(queue.get(), heartbeat_s)
        except TimeoutError:
            yield None
            continue
        if frame == OVERFLOW:
            log.info("ending a feed whose client fell behind its updates")
            raise FeedEnded(CloseCode.TOO_SLOW)
        if frame != SOURCE_ENDED:
            yield frame


def _wake(queue: Outbox) -> None:
    """Wake a feed waiting for its queue (a full queue wakes it anyway)."""
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(SOURCE_ENDED)


def put_or_overflow(queue: Outbox, frame: str) -> None:
    """Queue `frame` for a feed with no cursor to resume from (the inbox, the thread list): a
    reader this far behind is ended, as a WebSocket is (`CloseCode.TOO_SLOW`), and reads a
    fresh snapshot when it reconnects."""
    try:
        queue.put_nowait(frame)
    except asyncio.QueueFull:
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(OVERFLOW)


def _cursor(request: Request) -> int:
    """`Last-Event-ID` (a reconnecting EventSource's) wins over `after_seq` (a first visit's)."""
    header = request.headers.get("last-event-id")
    if header is not None and header != "":
        return int_value("Last-Event-ID", header, 0, low=0, high=MAX_AFTER)
    return int_value("after_seq", request.query_params.get("after_seq"), 0, low=0, high=MAX_AFTER)


def _epoch(request: Request) -> str | None:
    epoch = request.query_params.get("epoch")
    if epoch is not None and (not epoch or len(epoch) > MAX_ID_CHARS):
        raise GatewayError(ErrorCode.BAD_REQUEST, "epoch must be a non-empty id")
    return epoch


def _omitted(request: Request) -> frozenset[str]:
    """`omit=reasoning,usage`: the added events to leave out, as a hello's `omit` does."""
    raw = request.query_params.get("omit")
    if not raw:
        return frozenset()
    kinds = raw.split(",")
    unknown = [kind for kind in kinds if kind not in protocol.OMITTABLE]
    if unknown:
        choices = ", ".join(sorted(protocol.OMITTABLE))
        raise GatewayError(ErrorCode.BAD_REQUEST, f"omit takes a list of {choices}")
    return frozenset().union(*(protocol.OMITTABLE[kind] for kind in kinds))


@endpoint
async def thread_stream(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    thread_id = path_id(request, "thread_id")
    after_seq, epoch, omit = _cursor(request), _epoch(request), _omitted(request)
    thread = await services.runs.authorize_subscribe(principal, thread_id)
    cursor, reset = resume_point(thread, after_seq, epoch)
    subscribed = protocol.encode(
        protocol.subscribed(thread_id, thread.epoch, thread.head_seq, reset)
    )
    slot = services.limits.open_connection(principal.tenant, principal.user)
    body = _feed(services, principal, thread_id, cursor, subscribed, omit)
    return feed_response(body, slot, services, principal)


def _queue(services: Services) -> Outbox:
    settings = services.settings
    return Outbox(settings.send_queue_size, settings.send_queue_bytes)


def queued_subscription(
    services: Services,
    principal: Principal,
    thread_id: str,
    after_seq: int,
    omit: frozenset[str] = frozenset(),
) -> tuple[Outbox, Subscription]:
    """A subscription from `after_seq` whose frames (as `principal` may see them, without the
    event types of `omit`) go into a queue the caller drains; not started. Bounded like a
    WebSocket's outgoing queue, in frames and in bytes: a reader that falls behind makes the
    subscription read the table at its pace instead of growing the queue."""
    queue = _queue(services)

    def send_live(frame: str, _committed: float) -> bool:
        try:
            queue.put_nowait(frame)
        except asyncio.QueueFull:
            return False
        return True

    async def reveal(event: LoggedEvent) -> str:
        return await frame_for(principal, event, services.runs.approvals)

    subscription = Subscription(
        thread_id=thread_id,
        after_seq=after_seq,
        bus=services.bus,
        log=services.log,
        send_replay=queue.put,
        send_live=send_live,
        reveal=reveal,
        metrics=services.metrics,
        omit=omit,
    )
    return queue, subscription


async def _feed(
    services: Services,
    principal: Principal,
    thread_id: str,
    cursor: int,
    subscribed: str,
    omit: frozenset[str],
) -> AsyncIterator[bytes]:
    yield f"retry: {RETRY_MS}\n".encode() + sse_message(subscribed, event="subscribed")
    queue, subscription = queued_subscription(services, principal, thread_id, cursor, omit)
    subscription.start()
    task = subscription.task
    assert task is not None
    try:
        # The subscription's task ends only when it could not read the log: the feed ends
        # then, and the client resumes from its Last-Event-ID.
        async for frame in feed_frames(services, queue, source=task):
            if frame is None:
                yield HEARTBEAT
                continue
            seq = orjson.loads(frame).get("seq")
            yield sse_message(frame, event_id=seq if isinstance(seq, int) else None)
    finally:
        subscription.close()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


@endpoint
async def inbox_stream(request: Request, services: Services) -> Response:
    """`inbox.subscribe` over HTTP: `event: inbox` with the pending approvals, then an
    `event: inbox.update` message per change, with the same access and per-reader views."""
    principal = await authenticate(request, services)
    check_can_use_inbox(principal)
    slot = services.limits.open_connection(principal.tenant, principal.user)
    return feed_response(_inbox_feed(services, principal), slot, services, principal)


async def _inbox_feed(services: Services, principal: Principal) -> AsyncIterator[bytes]:
    views = services.runs.views
    queue = _queue(services)

    def on_update(added: list[dict[str, Any]], removed: list[str]) -> None:
        frame = protocol.inbox_update(views.for_inbox_reader(principal, added), removed)
        put_or_overflow(queue, protocol.encode(frame))

    # Subscribed before the snapshot is read, so no change falls between the two; updates
    # that arrive meanwhile wait in the queue and follow the snapshot.
    unsubscribe = services.bus.subscribe_inbox(principal.tenant, on_update)
    try:
        pending = await views.inbox_views(principal)
        snapshot = protocol.encode(protocol.inbox(pending))
        yield f"retry: {RETRY_MS}\n".encode() + sse_message(snapshot, event="inbox")
        async for frame in feed_frames(services, queue):
            if frame is None:
                yield HEARTBEAT
                continue
            yield sse_message(frame, event="inbox.update")
    finally:
        unsubscribe()
