"""A thread's stored events as values, for the frontend adapters: replay from a cursor, then
live, every seq once and in order (the native subscription, `Subscription`, underneath), each
event as the caller may see it (sensitive arguments revealed to reviewers, as on the native
protocol)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.run_lifecycle.sensitive_arguments import frame_for
from gateway.storage.health import StorageUnavailable
from gateway.transport.sse import queued_subscription

READ_PAGE = 500


@dataclass(frozen=True, slots=True)
class LogEntry:
    seq: int
    run_id: str | None
    type: str
    ts: str
    data: dict[str, Any]

    @classmethod
    def of_frame(cls, frame: str) -> LogEntry:
        event = orjson.loads(frame)
        return cls(event["seq"], event["run_id"], event["event"], event["ts"], event["data"])


async def follow(
    services: Services, principal: Principal, thread_id: str, after_seq: int
) -> AsyncIterator[LogEntry]:
    """The thread's events after `after_seq`, then live ones as they are stored, until the
    caller stops iterating. Raises StorageUnavailable when the log cannot be read (the caller
    resumes from the last seq it saw)."""
    queue, subscription = queued_subscription(services, principal, thread_id, after_seq)
    subscription.start()
    task = subscription.task
    assert task is not None
    getter: asyncio.Task[str] | None = None
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                # The subscription ended: it could not read the log.
                raise StorageUnavailable("the thread's log could not be read")
            yield LogEntry.of_frame(getter.result())
            getter = None
    finally:
        if getter is not None:
            getter.cancel()
        subscription.close()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def read_span(
    services: Services, principal: Principal, thread_id: str, after_seq: int, upto: int
) -> list[LogEntry]:
    """The stored events with `after_seq < seq <= upto`, as `principal` may see them."""
    entries: list[LogEntry] = []
    cursor = after_seq
    while cursor < upto:
        page = await services.log.read(thread_id, after_seq=cursor, limit=READ_PAGE)
        for event in page:
            if event.seq > upto:
                return entries
            frame = await frame_for(principal, event, services.runs.approvals)
            entries.append(LogEntry.of_frame(frame))
            cursor = event.seq
        if len(page) < READ_PAGE:
            break
    return entries
