"""EventLog: the single writer of every thread's event log.

Streamed events are queued and group-committed (everything queued goes in one transaction);
only after the commit are they published to subscribers, so no client ever sees an event that
could be lost. While a commit is in flight the next batch queues up; consecutive text deltas of
one message in it are stored as one `message.delta` (PROTOCOL §6 allows several model deltas in
one), so a busy gateway stores, encodes and sends fewer, larger events, and an idle one (batches
of one) sends every delta as soon as it is stored.

State changes that must be atomic with their event (a decision and its `approval.decided`, a
checkpoint and its `approval.requested` + `run.paused`, a status and its `run.completed`) go
through the same queue as one transaction each, which keeps the log in exactly the order the
gateway produced it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.bus import EventBus
from gateway.eventlog_types import LoggedEvent, encode_page
from persistence.db import transaction
from persistence.direct import Direct
from persistence.errors import StorageUnavailable
from persistence.events import (
    EventRecord,
    EventRepository,
    NewEvent,
    SqliteEventStore,
    direct_store,
)
from persistence.leases import Lease, LeaseLost, LeaseRepository

log = logging.getLogger(__name__)

Action = Callable[[AsyncConnection], Awaitable[Any]]
# The same state change as an `Action`, as the repositories' direct statements (SQLite file).
DirectAction = Callable[[Direct], Any]

MAX_BATCH = 1024
# A failing plain batch is retried this long before its callers are told; streamed events are
# the log of a live run and dropping them would leave a hole in what clients see.
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0)
MESSAGE_DELTA = "message.delta"
# Only deltas of exactly this shape are merged; one that carries anything more stays whole.
_DELTA_KEYS = frozenset({"message_id", "delta"})
# A merged delta stops growing here, so a writer that fell far behind (a storage outage being
# retried) still sends frames of a reasonable size.
MAX_MERGED_DELTA_CHARS = 8192


def event_ts(moment: datetime | None = None) -> str:
    """A `ts`: millisecond UTC text of `moment`, or of now."""
    if moment is None:
        return EventClock().now()
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class EventClock:
    """Event timestamps of now, from the epoch seconds (about 3x cheaper than formatting a
    `datetime`), with the formatted second kept from one call to the next: a busy gateway
    stamps thousands of events within each second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def now(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
        return f"{self._prefix}{int(now * 1000) % 1000:03d}Z"


@dataclass
class _Plain:
    event: NewEvent
    future: asyncio.Future[LoggedEvent]
    # For a `message.delta`: (message_id, text), so the writer can merge it with its neighbours.
    delta: tuple[str, str] | None = None


@dataclass
class _Group:
    """One event to store, standing for one or more queued `_Plain` entries (merged deltas)."""

    event: NewEvent
    futures: list[asyncio.Future[LoggedEvent]]
    delta: tuple[str, str] | None
    parts: list[str] | None = None  # texts of merged deltas, in order; None while unmerged
    size: int = 0

    def absorb(self, entry: _Plain) -> bool:
        """Take `entry` into this event if both are text deltas of the same message."""
        if self.delta is None or entry.delta is None or entry.delta[0] != self.delta[0]:
            return False
        first, new = self.event, entry.event
        if (new.thread_id, new.run_id, new.lease) != (first.thread_id, first.run_id, first.lease):
            return False
        text = entry.delta[1]
        if self.parts is None:
            self.parts, self.size = [self.delta[1]], len(self.delta[1])
        if self.size + len(text) > MAX_MERGED_DELTA_CHARS:
            return False
        self.parts.append(text)
        self.size += len(text)
        self.futures.append(entry.future)
        return True

    def stored_event(self) -> NewEvent:
        if self.parts is None or self.delta is None:
            return self.event
        # The first delta's `ts`: the merged event is as old as the oldest text it carries.
        data = orjson.dumps({"message_id": self.delta[0], "delta": "".join(self.parts)})
        return self.event._replace(data=data.decode())


def merge_deltas(entries: Sequence[_Plain]) -> list[_Group]:
    """Queued events in storage order, each thread's consecutive deltas of a message merged.

    Only entries already queued together are merged, and only with the previous event *of the
    same thread*: another thread's events in between do not matter (every thread has its own
    seq), so each thread's log keeps exactly the order its events were produced in.
    """
    groups: list[_Group] = []
    last: dict[str, _Group] = {}
    for entry in entries:
        previous = last.get(entry.event.thread_id)
        if previous is not None and previous.absorb(entry):
            continue
        group = _Group(entry.event, [entry.future], entry.delta)
        groups.append(group)
        last[entry.event.thread_id] = group
    return groups


@dataclass
class _Atomic:
    events: list[NewEvent]
    action: Action | None
    direct: DirectAction | None
    future: asyncio.Future[tuple[Any, list[LoggedEvent]]]


class EventLog:
    def __init__(self, engine: AsyncEngine, bus: EventBus, *, max_queued: int = 10_000) -> None:
        self._engine = engine
        self._bus = bus
        self._queue: asyncio.Queue[_Plain | _Atomic | None] = asyncio.Queue(max_queued)
        self._task: asyncio.Task[None] | None = None
        self._store = SqliteEventStore.for_engine(engine)
        self._clock = EventClock()

    @property
    def store(self) -> SqliteEventStore | None:
        """The direct SQLite path, shared with the repositories' reads (None: engine only)."""
        return self._store

    async def start(self) -> None:
        self._task = asyncio.create_task(self._writer(), name="event-log-writer")

    async def close(self) -> None:
        if self._task is None:
            return
        await self._queue.put(None)
        await self._task
        self._task = None
        if self._store is not None:
            await self._store.close()

    def new_event(
        self,
        thread_id: str,
        run_id: str | None,
        type_: str,
        data: Any,
        lease: Lease | None = None,
    ) -> NewEvent:
        return NewEvent(
            thread_id, run_id, str(type_), self._clock.now(), orjson.dumps(data).decode(), lease
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
        delta = None
        if type_ == MESSAGE_DELTA and isinstance(data, dict) and data.keys() == _DELTA_KEYS:
            message_id, text = data["message_id"], data["delta"]
            if isinstance(message_id, str) and isinstance(text, str):
                delta = (message_id, text)
        entry = _Plain(event, future, delta)
        try:
            # No coroutine per streamed event while the queue has room, as it usually has.
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            await self._queue.put(entry)
        return future

    async def commit(
        self,
        events: Sequence[NewEvent] = (),
        action: Action | None = None,
        direct: DirectAction | None = None,
    ) -> tuple[Any, list[LoggedEvent]]:
        """Run `action` and store `events` in one transaction, after everything queued before.

        `direct`, when given, is the same change written for the direct SQLite path; it runs
        instead of `action` whenever that path is in use (the whole transaction is one call on
        the writer lane), so both must write the same rows and return the same result.

        Returns the action's result and the stored events. If the action raises, nothing is
        stored and the exception propagates to the caller; storage failures surface as
        `StorageUnavailable`.
        """
        future: asyncio.Future[tuple[Any, list[LoggedEvent]]] = (
            asyncio.get_running_loop().create_future()
        )
        await self._queue.put(_Atomic(list(events), action, direct, future))
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
        groups = merge_deltas(entries)
        events = [group.stored_event() for group in groups]
        for attempt, delay in enumerate((0.0, *RETRY_DELAYS_S)):
            if delay:
                await asyncio.sleep(delay)
            try:
                records, lost = await self._store_fenced(events)
            except StorageUnavailable as exc:
                log.warning("event log write failed (attempt %d): %s", attempt + 1, exc)
                continue
            except Exception as exc:  # a bug or a vanished thread: fail these callers only
                log.error("event log write failed", exc_info=True)
                for group in groups:
                    _fail(group, exc)
                return
            if lost:
                for group in groups:
                    if group.event.lease in lost:
                        _fail(group, LeaseLost(group.event.run_id or ""))
                groups = [g for g in groups if g.event.lease not in lost]
            logged = [LoggedEvent.from_record(record) for record in records]
            for group, event in zip(groups, logged, strict=True):
                for future in group.futures:
                    if not future.done():
                        future.set_result(event)
            self._publish(logged)
            return
        error = StorageUnavailable("event log could not be stored")
        for group in groups:
            _fail(group, error)

    def _direct(self) -> SqliteEventStore | None:
        return direct_store(self._store)

    async def _store_fenced(self, events: list[NewEvent]) -> tuple[list[EventRecord], set[Lease]]:
        """One transaction: check each lease once, store the events whose lease still holds.

        Returns the stored records, in order, and the leases found lost (their events are not
        stored)."""
        leases = {e.lease for e in events if e.lease is not None}
        direct = self._direct()
        if direct is not None:
            return await direct.append(events, leases)
        async with transaction(self._engine) as conn:
            lost: set[Lease] = set()
            for lease in leases:
                try:
                    await LeaseRepository.fence_in(conn, lease)
                except LeaseLost:
                    lost.add(lease)
            kept = [e for e in events if e.lease not in lost] if lost else events
            records = await EventRepository.append_in(conn, kept) if kept else []
        return records, lost

    async def _commit_atomic(self, entry: _Atomic) -> None:
        direct = self._direct() if entry.action is None or entry.direct is not None else None
        try:
            if direct is not None:
                result, records = await direct.commit(entry.events, entry.direct)
            else:
                result, records = await self._commit_engine(entry)
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

    async def _commit_engine(self, entry: _Atomic) -> tuple[Any, list[EventRecord]]:
        async with transaction(self._engine) as conn:
            for lease in {e.lease for e in entry.events if e.lease is not None}:
                await LeaseRepository.fence_in(conn, lease)
            result = await entry.action(conn) if entry.action is not None else None
            records = await EventRepository.append_in(conn, entry.events) if entry.events else []
        return result, records

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
        direct = self._direct()
        if direct is not None:
            records = await direct.read(thread_id, after_seq=after_seq, limit=limit)
        else:
            records = await EventRepository(self._engine).read(
                thread_id, after_seq=after_seq, limit=limit
            )
        return encode_page(records)


def _fail(group: _Group, error: BaseException) -> None:
    for future in group.futures:
        if not future.done():
            future.set_exception(error)
