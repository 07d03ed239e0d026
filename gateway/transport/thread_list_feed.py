"""The live thread list as Server-Sent Events (docs/protocol.md §8 "Threads"):
`threads.subscribe` (§4) for clients without a WebSocket.

`event: threads` with the whole list, then `event: threads.update` with each change, as the
WebSocket sends them. A list has no cursor: a reader too far behind is ended and gets a fresh
list when it reconnects, as the inbox feed does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.protocol import frames as protocol
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.run_lifecycle.thread_list import check_can_list
from gateway.transport.http_api import authenticate, endpoint
from gateway.transport.http_threads import archived_param
from gateway.transport.outbox import Outbox
from gateway.transport.sse import (
    HEARTBEAT,
    RETRY_MS,
    feed_frames,
    feed_response,
    put_or_overflow,
    sse_message,
)


@endpoint
async def threads_stream(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    check_can_list(principal)
    archived = archived_param(request)
    slot = services.limits.open_connection(principal.tenant, principal.user)
    return feed_response(_threads_feed(services, principal, archived), slot, services, principal)


async def _threads_feed(
    services: Services, principal: Principal, archived: bool
) -> AsyncIterator[bytes]:
    settings = services.settings
    queue = Outbox(settings.send_queue_size, settings.send_queue_bytes)

    def put(frame: dict[str, Any]) -> None:
        put_or_overflow(queue, protocol.encode(frame))

    snapshot, stop = await services.runs.thread_list.watch(
        principal,
        archived=archived,
        on_update=lambda views, removed: put(protocol.threads_update(views, removed)),
        on_snapshot=lambda views: put(protocol.threads(views)),
    )
    try:
        first = sse_message(protocol.encode(protocol.threads(snapshot)), event="threads")
        yield f"retry: {RETRY_MS}\n".encode() + first
        async for frame in feed_frames(services, queue):
            if frame is None:
                yield HEARTBEAT
                continue
            kind = "threads" if frame.startswith('{"type":"threads",') else "threads.update"
            yield sse_message(frame, event=kind)
    finally:
        stop()


def routes() -> list[Route]:
    # Before the routes of one thread (`/v1/threads/{thread_id}`), whose id `stream` is not.
    return [Route("/v1/threads/stream", threads_stream, methods=["GET"])]
