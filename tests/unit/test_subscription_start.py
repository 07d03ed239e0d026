"""A subscription started with the events of its run's first commit (gateway/event_log/
subscription.py `Subscription.start`): when they are all the log has (`caught_up`), it goes
live without reading the log, and reads it only for what it was not told of; otherwise it
catches up with one read, as any subscription does."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.event_log.bus import EventBus
from gateway.event_log.logged_event import LoggedEvent
from gateway.event_log.subscription import Subscription
from gateway.event_log.writer import EventLog
from tests.support.storage import running_event_log, seq_of


class Reads:
    """The log's reads, counted on their way to the real log."""

    def __init__(self, log: EventLog) -> None:
        self.count = 0
        self._read = log.read

    async def __call__(self, thread_id: str, *, after_seq: int, limit: int = 500) -> list[Any]:
        self.count += 1
        return await self._read(thread_id, after_seq=after_seq, limit=limit)


def follow(
    log: EventLog, bus: EventBus, thread_id: str, reads: Reads
) -> tuple[Subscription, list[int]]:
    seqs: list[int] = []

    def send(frame: str, _committed: float = 0.0) -> bool:
        seqs.append(seq_of(frame))
        return True

    log.read = reads  # type: ignore[method-assign]
    subscription = Subscription(
        thread_id=thread_id,
        after_seq=0,
        bus=bus,
        log=log,
        send_replay=send,
        send_live=send,
    )
    return subscription, seqs


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def first_commit(log: EventLog, thread_id: str) -> list[LoggedEvent]:
    _, logged = await log.commit([log.new_event(thread_id, "r_1", "run.started", {})], None)
    return logged


async def test_caught_up_it_reads_nothing_until_it_misses_something(
    log_and_thread: tuple[EventLog, str, EventBus],
) -> None:
    log, thread_id, bus = log_and_thread
    reads = Reads(log)
    initial = await first_commit(log, thread_id)
    subscription, seqs = follow(log, bus, thread_id, reads)
    subscription.start(initial, caught_up=True)
    await turns()
    assert seqs == [1] and reads.count == 0
    # The log watch's poll finds the head it was handed: nothing to wake it for.
    bus.wake(thread_id, 1)
    await turns()
    assert reads.count == 0
    # Told of the next commit: sent live, still nothing read.
    await (await log.append(thread_id, "r_1", "tool.called", {"call_id": "c1"}))
    await turns()
    assert seqs == [1, 2] and reads.count == 0
    # Events another process stored arrive as a bare wake-up: read from the log.
    async with running_event_log(log._store, EventBus()) as elsewhere:
        await elsewhere.commit([elsewhere.new_event(thread_id, "r_1", "run.paused", {})], None)
    bus.wake(thread_id, 3)
    await turns()
    assert seqs == [1, 2, 3] and reads.count == 1
    subscription.close()


async def test_not_caught_up_it_reads_the_log_once_to_catch_up(
    log_and_thread: tuple[EventLog, str, EventBus],
) -> None:
    log, thread_id, bus = log_and_thread
    reads = Reads(log)
    initial = await first_commit(log, thread_id)
    # Stored after the first commit and before the subscription: `initial` is not all.
    await (await log.append(thread_id, "r_1", "tool.called", {"call_id": "c1"}))
    subscription, seqs = follow(log, bus, thread_id, reads)
    subscription.start(initial)
    await turns()
    assert seqs == [1, 2] and reads.count == 1
    subscription.close()


async def test_wake_ups_for_what_this_process_committed_wake_nobody(
    log_and_thread: tuple[EventLog, str, EventBus],
) -> None:
    """A head the log watch (or the relay) reports that this process committed itself wakes
    no listener: they hear of those events from this process. Beyond it, they are woken."""
    _, thread_id, bus = log_and_thread
    woken: list[int] = []
    bus.subscribe(thread_id, lambda events, _committed: woken.append(len(events)))
    committed = LoggedEvent(thread_id, 5, "r_1", "tool.called", "ts", "{}")
    bus.committed_here([committed])
    bus.wake(thread_id, 5)
    assert woken == []
    bus.wake(thread_id, 6)
    assert woken == [0]
