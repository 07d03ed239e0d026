"""EventLog: the single writer of every thread's event log.

Streamed events are queued and group-committed (everything queued goes in one transaction);
only after the commit are they published to subscribers, so no client ever sees an event that
could be lost. While the writer is busy the next batch queues up; a text delta that arrives
while the previous queued event of its thread is a delta of the same message still waiting for
the writer joins it (docs/protocol.md §6 allows several model deltas in one `message.delta`), so a
busy gateway stores, encodes and sends fewer, larger events, each extra delta costs a list append,
and an idle one (nothing waiting) sends every delta as soon as it is stored.

State changes that must be atomic with their event (a decision and its `approval.decided`, a
checkpoint and its `approval.requested` + `run.paused`, a status and its `run.completed`) go
through the same queue, which keeps the log in exactly the order the gateway produced it. Each
is all or nothing on its own: taken alone it is one transaction; taken with others queued
beside it, one savepoint in their shared transaction (`Store.commit_parts`), so 200 runs
starting at once cost a few commits (and WAL flushes), not 200.

A batch holding an event that is announced beyond the log (a webhook, docs/protocol.md §10)
writes the announcement in its own transaction; batches without one (all streamed deltas) cost
one set lookup per event and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import orjson

from gateway.event_log.bus import EventBus
from gateway.event_log.logged_event import LoggedEvent, encode_page
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.tracing import Telemetry
from persistence.errors import StorageUnavailable
from persistence.events import Announce, EventRecord, NewEvent
from persistence.leases import Lease, LeaseLost
from persistence.store import Part, PartsAborted, PartStored, Store, Work

log = logging.getLogger(__name__)

MAX_BATCH = 1024
# A failing plain batch is retried this long before its callers are told; streamed events are
# the log of a live run and dropping them would leave a hole in what clients see.
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0)
MESSAGE_DELTA = "message.delta"
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
    """One queued event. A `message.delta` stays open for more text of its message until the
    writer takes it: later deltas are added to `parts` instead of being queued (one stored
    event, one future, for them all)."""

    event: NewEvent
    future: asyncio.Future[LoggedEvent]
    message_id: str | None = None  # set for a text delta
    parts: list[str] | None = None  # its texts, in order
    size: int = 0
    queued_at: float = 0.0  # a text delta's, when the writer holds deltas (`merge_s`)

    def extend(self, run_id: str | None, lease: Lease | None, message_id: str, text: str) -> bool:
        """Take one more delta of the same message, run and lease, up to the size cap."""
        event = self.event
        if (
            self.parts is None
            or message_id != self.message_id
            or run_id != event.run_id
            # A run passes the same Lease object with every event: identity settles it
            # without the dataclass's field-by-field comparison.
            or (lease is not event.lease and lease != event.lease)
            or self.size + len(text) > MAX_MERGED_DELTA_CHARS
        ):
            return False
        self.parts.append(text)
        self.size += len(text)
        return True

    def stored_event(self) -> NewEvent:
        if self.parts is None or len(self.parts) == 1:
            return self.event
        # The first delta's `ts`: the merged event is as old as the oldest text it carries.
        data = orjson.dumps({"message_id": self.message_id, "delta": "".join(self.parts)})
        return self.event._replace(data=data.decode())


def _delta_text(type_: str, data: Any) -> tuple[str, str] | None:
    """(message id, text) of a plain text delta; anything that carries more stays whole."""
    if type_ != MESSAGE_DELTA or not isinstance(data, dict) or len(data) != 2:
        return None
    # Two entries, both of these keys: exactly `message_id` and `delta`, checked without
    # building a key view per streamed delta.
    message_id, text = data.get("message_id"), data.get("delta")
    if isinstance(message_id, str) and isinstance(text, str):
        return message_id, text
    return None


@dataclass
class _Atomic:
    events: list[NewEvent]
    action: Work[Any] | None
    future: asyncio.Future[tuple[Any, list[LoggedEvent]]]
    # The agent of the run whose `run.*` events these are, for the metrics' `agent` label.
    agent: str | None = None
    # `action` is one statement (`Store.commit`).
    single_statement: bool = False


class Announcements(Protocol):
    """What announces some events beyond the log (the webhook outbox): it writes in the
    events' own transaction, and hears when such a transaction committed."""

    def announcer(self, events: Sequence[NewEvent]) -> Announce | None: ...

    def announced(self) -> None: ...


class EventLog:
    def __init__(
        self,
        store: Store,
        bus: EventBus,
        *,
        max_queued: int = 10_000,
        metrics: GatewayMetrics | None = None,
        telemetry: Telemetry | None = None,
        announcements: Announcements | None = None,
        merge_s: float = 0.0,
    ) -> None:
        """`merge_s`: how long the writer holds a text delta for more text of its message
        (GATEWAY_DELTA_MERGE_MS); 0 stores each as soon as the writer is free."""
        self._store = store
        self._merge_s = merge_s
        # While the writer holds a delta: resolved early by anything that must not wait (an
        # atomic commit, a flush, closing).
        self._hold: asyncio.Future[None] | None = None
        # Set when an atomic commit (or the closing None) is queued; cleared once the writer has
        # emptied the queue. Set, the writer holds nothing: something queued must not wait.
        self._urgent_queued = False
        self._announcements = announcements
        self._metrics = metrics
        self._telemetry = telemetry or Telemetry(None)
        self._bus = bus
        self._queue: asyncio.Queue[_Plain | _Atomic | None] = asyncio.Queue(max_queued)
        self._task: asyncio.Task[None] | None = None
        self._clock = EventClock()
        # thread id -> its newest queued entry while that is a text delta the writer has not
        # taken yet (`append` adds the thread's next deltas to it)
        self._open_deltas: dict[str, _Plain] = {}
        # Commits whose events wait for the loop's next turn to be published (`_publish_soon`).
        self._unpublished = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._writer(), name="event-log-writer")

    async def close(self) -> None:
        if self._task is None:
            return
        self._urgent_queued = True
        await self._queue.put(None)
        self._end_hold()
        await self._task
        self._task = None

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
        delta = _delta_text(type_, data)
        # Only the thread's newest queued entry may take more text: anything queued after it
        # for the thread (or any atomic commit) closes it, so the log keeps the order in
        # which events were produced.
        open_entry = self._open_deltas.pop(thread_id, None)
        if (
            open_entry is not None
            and delta is not None
            and open_entry.extend(run_id, lease, *delta)
        ):
            self._open_deltas[thread_id] = open_entry
            return open_entry.future
        future: asyncio.Future[LoggedEvent] = asyncio.get_running_loop().create_future()
        event = self.new_event(thread_id, run_id, type_, data, lease)
        entry = _Plain(event, future)
        if delta is not None:
            entry.message_id, entry.parts, entry.size = delta[0], [delta[1]], len(delta[1])
            if self._merge_s:
                entry.queued_at = time.monotonic()
        try:
            # No coroutine per streamed event while the queue has room, as it usually has.
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            await self._queue.put(entry)
        if delta is not None:
            self._open_deltas[thread_id] = entry
        return future

    async def commit(
        self,
        events: Sequence[NewEvent] = (),
        action: Work[Any] | None = None,
        *,
        agent: str | None = None,
    ) -> tuple[Any, list[LoggedEvent]]:
        """Run `action` and store `events` in one transaction, after everything queued before.
        `agent`: the run's, when `events` hold a run's `run.*` events (counted by agent).

        Returns the action's result and the stored events. If the action raises, nothing is
        stored and the exception propagates to the caller; storage failures surface as
        `StorageUnavailable`.
        """
        return await (await self.queue_commit(events, action, agent=agent))

    async def queue_commit(
        self,
        events: Sequence[NewEvent] = (),
        action: Work[Any] | None = None,
        *,
        agent: str | None = None,
        single_statement: bool = False,
    ) -> asyncio.Future[tuple[Any, list[LoggedEvent]]]:
        """`commit`, returning once it is queued (it waits only for queue space): whatever
        is queued after it is stored after it. The future resolves as `commit` returns.
        `single_statement`: `action` is one statement (`Store.commit`)."""
        future: asyncio.Future[tuple[Any, list[LoggedEvent]]] = (
            asyncio.get_running_loop().create_future()
        )
        # Nothing produced after this commit may be stored before it.
        self._open_deltas.clear()
        self._urgent_queued = True
        entry = _Atomic(list(events), action, future, agent, single_statement)
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            await self._queue.put(entry)
        self._end_hold()
        return future

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (or has failed)."""
        await self.commit()

    async def _writer(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if self._merge_s and isinstance(item, _Plain) and item.parts is not None:
                await self._held_until(item.queued_at + self._merge_s)
            items: list[_Plain | _Atomic] = [item]
            stop = False
            while len(items) < MAX_BATCH and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is None:
                    stop = True
                    break
                items.append(nxt)
            if self._queue.empty():
                self._urgent_queued = False  # all taken, atomic commits included
            # Consecutive plain entries make one group; each atomic commit is one of its own.
            groups: list[list[_Plain] | _Atomic] = []
            for entry in items:
                if isinstance(entry, _Atomic):
                    groups.append(entry)
                    continue
                # Taken: from here on its text is final.
                thread_id = entry.event.thread_id
                if self._open_deltas.get(thread_id) is entry:
                    del self._open_deltas[thread_id]
                if groups and isinstance(groups[-1], list):
                    groups[-1].append(entry)
                else:
                    groups.append([entry])
            if len(groups) == 1:
                await self._commit_alone(groups[0])
            else:
                await self._commit_groups(groups)
            if stop:
                return

    async def _held_until(self, moment: float) -> None:
        """Wait until `moment` (monotonic) while the deltas queued so far take more text of
        their messages, unless something that must not wait is queued first."""
        delay = moment - time.monotonic()
        if delay <= 0 or self._urgent_queued:
            return
        loop = asyncio.get_running_loop()
        self._hold = loop.create_future()
        timer = loop.call_later(delay, self._end_hold)
        try:
            await self._hold
        finally:
            timer.cancel()
            self._hold = None

    def _end_hold(self) -> None:
        if self._hold is not None and not self._hold.done():
            self._hold.set_result(None)

    async def _commit_alone(self, group: list[_Plain] | _Atomic) -> None:
        if isinstance(group, list):
            await self._commit_plain(group)
        else:
            await self._commit_atomic(group)

    async def _commit_groups(self, groups: list[list[_Plain] | _Atomic]) -> None:
        """Several groups (atomic commits among them) in one transaction, each in a savepoint
        of its own, so a commit refused (a lost lease, a stale decision) refuses only itself.

        If the transaction fails as a whole, each group goes its own way: after a failure
        before the commit (nothing stored) every group is committed alone, as if it had been
        taken alone; after a failure that may have hit the `COMMIT` itself, the atomic
        commits fail with it (as one failing alone would) and the streamed events are retried
        (as a failing batch of them is)."""
        parts: list[Part] = []
        for group in groups:
            if isinstance(group, list):
                batch, action, atomic = [entry.stored_event() for entry in group], None, False
            else:
                batch, action, atomic = group.events, group.action, True
            parts.append(Part(batch, action, self._announcer(batch), atomic))
        started = time.perf_counter()
        try:
            outcomes = await self._store.commit_parts(parts)
        except PartsAborted:
            for group in groups:
                await self._commit_alone(group)
            return
        except StorageUnavailable as exc:
            log.warning("event log write failed: %s", exc)
            for group in groups:
                if isinstance(group, list):
                    await self._commit_plain(group)
                else:
                    self._atomic_failed(group, exc)
            return
        for group, part, outcome in zip(groups, parts, outcomes, strict=True):
            if isinstance(group, list):
                if isinstance(outcome, PartStored):
                    self._plain_stored(group, outcome, started, part.announce)
                else:
                    self._plain_failed(group, outcome)
            elif isinstance(outcome, PartStored):
                self._atomic_stored(group, outcome, started, part.announce)
            else:
                self._atomic_failed(group, outcome)

    async def _commit_plain(self, entries: list[_Plain]) -> None:
        events = [entry.stored_event() for entry in entries]
        announce = self._announcer(events)
        for attempt, delay in enumerate((0.0, *RETRY_DELAYS_S)):
            if delay:
                await asyncio.sleep(delay)
            started = time.perf_counter()
            try:
                records, lost = await self._store.append(events, announce)
            except StorageUnavailable as exc:
                log.warning("event log write failed (attempt %d): %s", attempt + 1, exc)
                if self._metrics is not None:
                    self._metrics.failed()
                continue
            except Exception as exc:
                self._plain_failed(entries, exc)
                return
            self._plain_stored(entries, PartStored(None, records, lost), started, announce)
            return
        error = StorageUnavailable("event log could not be stored")
        for entry in entries:
            _fail(entry.future, error)

    def _plain_stored(
        self,
        entries: list[_Plain],
        stored: PartStored,
        started: float,
        announce: Announce | None,
    ) -> None:
        records, lost = stored.records, stored.lost
        if lost:
            for entry in entries:
                if entry.event.lease in lost:
                    _fail(entry.future, LeaseLost(entry.event.run_id or ""))
            entries = [entry for entry in entries if entry.event.lease not in lost]
        self._committed(records, started)
        if announce is not None and records:
            self._announced()
        logged = [LoggedEvent.from_record(record) for record in records]
        self._publish_soon(logged, next_turn=True)
        for entry, event in zip(entries, logged, strict=True):
            if not entry.future.done():
                entry.future.set_result(event)

    def _plain_failed(self, entries: list[_Plain], exc: Exception) -> None:
        """A bug or a vanished thread: these callers are told, nobody else."""
        log.error("event log write failed", exc_info=exc)
        if self._metrics is not None:
            self._metrics.failed()
        for entry in entries:
            _fail(entry.future, exc)

    async def _commit_atomic(self, entry: _Atomic) -> None:
        started = time.perf_counter()
        announce = self._announcer(entry.events)
        try:
            result, records = await self._store.commit(
                entry.events, entry.action, announce, single_statement=entry.single_statement
            )
        except BaseException as exc:
            self._atomic_failed(entry, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._atomic_stored(entry, PartStored(result, records, set()), started, announce)

    def _atomic_stored(
        self, entry: _Atomic, stored: PartStored, started: float, announce: Announce | None
    ) -> None:
        self._committed(stored.records, started, entry.agent)
        if announce is not None and stored.records:
            self._announced()
        logged = [LoggedEvent.from_record(record) for record in stored.records]
        self._publish_soon(logged, next_turn=False)
        if not entry.future.done():
            entry.future.set_result((stored.result, logged))

    def _atomic_failed(self, entry: _Atomic, exc: BaseException) -> None:
        # A refused action (a stale decision, a lost lease) is not a storage error.
        if self._metrics is not None and isinstance(exc, StorageUnavailable):
            self._metrics.failed()
        if not entry.future.done():
            entry.future.set_exception(exc)

    def _committed(
        self, records: list[EventRecord], started: float, agent: str | None = None
    ) -> None:
        """One transaction stored `records` (`started`: its `perf_counter` start), for the
        metrics and the traces."""
        if self._metrics is None and not self._telemetry.enabled:
            return
        seconds = time.perf_counter() - started
        if self._metrics is not None:
            self._metrics.committed(records, seconds, agent)
        if records and self._telemetry.enabled:
            ended = time.time()
            self._telemetry.record(
                "gateway.storage.commit",
                ended - seconds,
                ended,
                {"gateway.storage.events": len(records)},
            )

    def _announcer(self, events: Sequence[NewEvent]) -> Announce | None:
        if self._announcements is None or not events:
            return None
        return self._announcements.announcer(events)

    def _announced(self) -> None:
        if self._announcements is not None:
            self._announcements.announced()

    def _publish_soon(self, logged: list[LoggedEvent], *, next_turn: bool) -> None:
        """Publish a commit's events: streamed ones (`next_turn`) on the loop's next turn,
        a lifecycle commit's at once unless earlier ones still wait (they keep their order).

        Subscribers write live frames to their sockets as they are told. A commit of streamed
        events holds events of many threads: published inside the writer's turn, all of its
        frames were written before the loop ran anything else, and with 200 runs streaming
        (figure 7) the model's timers and the next events waited behind them (delivery lag p50
        2.6-2.8 against 2.1-2.2 ms; on the next turn, 2.1-2.2 ms). A lifecycle commit (a
        decision, a pause, a resume) is one request's, which waits for it: a turn more there
        only delays that request. Either way the events are published before the committers'
        futures resolve, so whatever a committer does next (the `ack` of the request that
        stored them) follows them."""
        committed = time.perf_counter()
        if next_turn or self._unpublished:
            self._unpublished += 1
            self._bus.committed_here(logged)
            asyncio.get_running_loop().call_soon(self._publish_waited, logged, committed)
        else:
            self._publish(logged, committed)

    def _publish_waited(self, logged: list[LoggedEvent], committed: float) -> None:
        self._unpublished -= 1
        self._publish(logged, committed)

    def _publish(self, logged: list[LoggedEvent], committed: float) -> None:
        by_thread: dict[str, list[LoggedEvent]] = {}
        for event in logged:
            by_thread.setdefault(event.thread_id, []).append(event)
        for thread_id, events in by_thread.items():
            try:
                self._bus.publish(thread_id, events, committed)
            except Exception:
                log.error("subscriber callback failed", exc_info=True)

    async def read(self, thread_id: str, *, after_seq: int, limit: int = 500) -> list[LoggedEvent]:
        return encode_page(
            await self._store.read_events(thread_id, after_seq=after_seq, limit=limit)
        )


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
        # Streamed events are not awaited one by one: marked as seen, so asyncio does not log
        # "Future exception was never retrieved" for each (the outage is logged once, by the
        # storage health); an awaiting caller still gets the error.
        future.exception()
