"""EventLog: the single writer of every thread's event log.

Streamed events are queued and group-committed (everything queued goes in one transaction);
only after the commit are they published to subscribers, so no client ever sees an event that
could be lost. State changes that must be atomic with their event (a decision and its
`approval.decided`, a checkpoint and its `approval.requested` + `run.paused`, a status and
its `run.completed`) go through the same queue as one transaction each, which keeps the log in
exactly the order the gateway produced it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.bus import EventBus
from gateway.eventlog_types import LoggedEvent
from persistence.db import transaction
from persistence.errors import StorageUnavailable
from persistence.events import EventRecord, EventRepository, NewEvent
from persistence.leases import Lease, LeaseLost, LeaseRepository

log = logging.getLogger(__name__)

Action = Callable[[AsyncConnection], Awaitable[Any]]

MAX_BATCH = 1024
# A failing plain batch is retried this long before its callers are told; streamed events are
# the log of a live run and dropping them would leave a hole in what clients see.
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0)


def event_ts(moment: datetime | None = None) -> str:
    moment = moment or datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass
class _Plain:
    event: NewEvent
    future: asyncio.Future[LoggedEvent]


@dataclass
class _Atomic:
    events: list[NewEvent]
    action: Action | None
    future: asyncio.Future[tuple[Any, list[LoggedEvent]]]


class EventLog:
    def __init__(self, engine: AsyncEngine, bus: EventBus, *, max_queued: int = 10_000) -> None:
        self._engine = engine
        self._bus = bus
        self._queue: asyncio.Queue[_Plain | _Atomic | None] = asyncio.Queue(max_queued)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._writer(), name="event-log-writer")

    async def close(self) -> None:
        if self._task is None:
            return
        await self._queue.put(None)
        await self._task
        self._task = None

    @staticmethod
    def new_event(
        thread_id: str, run_id: str | None, type_: str, data: Any, lease: Lease | None = None
    ) -> NewEvent:
        return NewEvent(
            thread_id, run_id, str(type_), event_ts(), orjson.dumps(data).decode(), lease
        )

    async def append(
        self,
        thread_id: str,
        run_id: str | None,
        type_: str,
        data: Any,
        lease: Lease | None = None,
    ) -> asyncio.Future[LoggedEvent]:
        """Queue one event; waits only for queue space. Await the future for durability.

        With a `lease`, the event is stored only while that lease is the run's current one;
        otherwise its future fails with `LeaseLost`.
        """
        future: asyncio.Future[LoggedEvent] = asyncio.get_running_loop().create_future()
        event = self.new_event(thread_id, run_id, type_, data, lease)
        await self._queue.put(_Plain(event, future))
        return future

    async def commit(
        self, events: Sequence[NewEvent] = (), action: Action | None = None
    ) -> tuple[Any, list[LoggedEvent]]:
        """Run `action` and store `events` in one transaction, after everything queued before.

        Returns the action's result and the stored events. If the action raises, nothing is
        stored and the exception propagates to the caller; storage failures surface as
        `StorageUnavailable`.
        """
        future: asyncio.Future[tuple[Any, list[LoggedEvent]]] = (
            asyncio.get_running_loop().create_future()
        )
        await self._queue.put(_Atomic(list(events), action, future))
        return await future

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (or has failed)."""
        await self.commit()

    async def _writer(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            items: list[_Plain | _Atomic] = [item]
            stop = False
            while len(items) < MAX_BATCH and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is None:
                    stop = True
                    break
                items.append(nxt)
            plain: list[_Plain] = []
            for entry in items:
                if isinstance(entry, _Plain):
                    plain.append(entry)
                    continue
                if plain:
                    await self._commit_plain(plain)
                    plain = []
                await self._commit_atomic(entry)
            if plain:
                await self._commit_plain(plain)
            if stop:
                return

    async def _commit_plain(self, entries: list[_Plain]) -> None:
        for attempt, delay in enumerate((0.0, *RETRY_DELAYS_S)):
            if delay:
                await asyncio.sleep(delay)
            try:
                kept, lost = await self._store_fenced(entries)
            except StorageUnavailable as exc:
                log.warning("event log write failed (attempt %d): %s", attempt + 1, exc)
                continue
            except Exception as exc:  # a bug or a vanished thread: fail these callers only
                log.error("event log write failed", exc_info=True)
                for entry in entries:
                    if not entry.future.done():
                        entry.future.set_exception(exc)
                return
            for entry in lost:
                if not entry.future.done():
                    entry.future.set_exception(LeaseLost(entry.event.run_id or ""))
            logged = [LoggedEvent.from_record(record) for record in kept[1]]
            for entry, event in zip(kept[0], logged, strict=True):
                if not entry.future.done():
                    entry.future.set_result(event)
            self._publish(logged)
            return
        error = StorageUnavailable("event log could not be stored")
        for entry in entries:
            if not entry.future.done():
                entry.future.set_exception(error)

    async def _store_fenced(
        self, entries: list[_Plain]
    ) -> tuple[tuple[list[_Plain], list[EventRecord]], list[_Plain]]:
        """One transaction: check each lease once, store the events whose lease still holds."""
        async with transaction(self._engine) as conn:
            lost_leases: set[Lease] = set()
            for lease in {e.event.lease for e in entries if e.event.lease is not None}:
                try:
                    await LeaseRepository.fence_in(conn, lease)
                except LeaseLost:
                    lost_leases.add(lease)
            kept = [e for e in entries if e.event.lease not in lost_leases]
            lost = [e for e in entries if e.event.lease in lost_leases]
            records = await EventRepository.append_in(conn, [e.event for e in kept]) if kept else []
        return (kept, records), lost

    async def _commit_atomic(self, entry: _Atomic) -> None:
        try:
            async with transaction(self._engine) as conn:
                for lease in {e.lease for e in entry.events if e.lease is not None}:
                    await LeaseRepository.fence_in(conn, lease)
                result = await entry.action(conn) if entry.action is not None else None
                records = (
                    await EventRepository.append_in(conn, entry.events) if entry.events else []
                )
        except BaseException as exc:
            if not entry.future.done():
                entry.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        logged = [LoggedEvent.from_record(record) for record in records]
        if not entry.future.done():
            entry.future.set_result((result, logged))
        self._publish(logged)

    def _publish(self, logged: list[LoggedEvent]) -> None:
        by_thread: dict[str, list[LoggedEvent]] = {}
        for event in logged:
            by_thread.setdefault(event.thread_id, []).append(event)
        for thread_id, events in by_thread.items():
            try:
                self._bus.publish(thread_id, events)
            except Exception:
                log.error("subscriber callback failed", exc_info=True)

    async def read(self, thread_id: str, *, after_seq: int, limit: int = 500) -> list[LoggedEvent]:
        records = await EventRepository(self._engine).read(
            thread_id, after_seq=after_seq, limit=limit
        )
        return [LoggedEvent.from_record(record) for record in records]
