"""A replay asks for its next page before it sends the one it has (gateway/event_log/
subscription.py `Subscription._pump`): every event still goes out once and in order, and a
subscription closed in the middle of a page leaves no read of the log behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.event_log.bus import EventBus
from gateway.event_log.subscription import FIRST_REPLAY_PAGE, Subscription
from gateway.event_log.writer import EventLog
from tests.support.storage import seq_of

EVENTS = FIRST_REPLAY_PAGE + 700


class Reads:
    """The log's reads, each noted when asked for, on their way to the real log; with
    `held`, every read after the first waits for it first (a slow database)."""

    def __init__(
        self,
        log: EventLog,
        held: asyncio.Event | None = None,
        on_ask: Callable[[], None] | None = None,
    ) -> None:
        """`on_ask`: called as each read is asked for, before it starts."""
        self.asked: list[int] = []
        self._read = log.read
        self._held = held
        self._on_ask = on_ask

    async def __call__(self, thread_id: str, *, after_seq: int, limit: int = 500) -> list[Any]:
        self.asked.append(after_seq)
        if self._on_ask is not None:
            self._on_ask()
        if self._held is not None and len(self.asked) > 1:
            await self._held.wait()
        return await self._read(thread_id, after_seq=after_seq, limit=limit)


async def a_long_thread(log: EventLog, thread_id: str) -> None:
    events = [
        log.new_event(thread_id, "r_1", "message.delta", {"delta": f"word {n} "})
        for n in range(EVENTS)
    ]
    await log.commit(events, None)


async def test_the_next_page_is_asked_for_before_this_one_is_sent(
    log_and_thread: tuple[EventLog, str, EventBus],
) -> None:
    log, thread_id, bus = log_and_thread
    await a_long_thread(log, thread_id)
    reads = Reads(log)
    log.read = reads  # type: ignore[method-assign]
    sent: list[int] = []
    # How many reads had been asked for when each page's first event was sent.
    asked_at_page_start: dict[int, int] = {}
    all_sent = asyncio.Event()

    def send(frame: str, _committed: float = 0.0) -> bool:
        seq = seq_of(frame)
        if seq - 1 in reads.asked:
            asked_at_page_start[seq] = len(reads.asked)
        sent.append(seq)
        if len(sent) == EVENTS:
            all_sent.set()
        return True

    subscription = Subscription(
        thread_id=thread_id, after_seq=0, bus=bus, log=log, send_replay=send, send_live=send
    )
    subscription.start()
    try:
        await asyncio.wait_for(all_sent.wait(), 10)
    finally:
        subscription.close()
    assert sent == list(range(1, EVENTS + 1))
    # Three pages (16, then as many as fit the byte budget, then the rest), and the read
    # after the last full one, which comes back short.
    first, second, *_ = reads.asked
    assert (first, second) == (0, FIRST_REPLAY_PAGE)
    # Each full page was sent with the next one already asked for.
    assert asked_at_page_start[1] == 2
    assert asked_at_page_start[FIRST_REPLAY_PAGE + 1] == 3


async def test_a_subscription_closed_mid_page_leaves_no_read_behind(
    log_and_thread: tuple[EventLog, str, EventBus],
) -> None:
    log, thread_id, bus = log_and_thread
    await a_long_thread(log, thread_id)
    # The read of the second page never finishes on its own.
    reads = Reads(log, held=asyncio.Event())
    log.read = reads  # type: ignore[method-assign]
    sent: list[int] = []
    stuck: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    at_stuck = asyncio.Event()

    def send(frame: str, _committed: float = 0.0) -> asyncio.Future[None] | bool:
        sent.append(seq_of(frame))
        if len(sent) < 5:
            return True
        # The client stops reading in the middle of the first page.
        at_stuck.set()
        return stuck

    subscription = Subscription(
        thread_id=thread_id, after_seq=0, bus=bus, log=log, send_replay=send, send_live=send
    )
    before = asyncio.all_tasks()
    subscription.start()
    await asyncio.wait_for(at_stuck.wait(), 10)
    # The second page was asked for before the first was sent.
    assert reads.asked == [0, FIRST_REPLAY_PAGE]
    subscription.close()
    assert subscription.task is not None
    await asyncio.gather(subscription.task, return_exceptions=True)
    await asyncio.sleep(0)
    assert subscription.task.cancelled()
    # The read of the next page was cancelled with the pump, not left running.
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()
    assert sent == [1, 2, 3, 4, 5]


async def test_a_subscription_closed_as_the_read_ahead_starts_leaves_no_read_behind(
    log_and_thread: tuple[EventLog, str, EventBus],
) -> None:
    log, thread_id, bus = log_and_thread
    await a_long_thread(log, thread_id)
    subscription: Subscription | None = None

    def close_at_the_second_read() -> None:
        # The pump has just handed the loop its turn for the read-ahead to start.
        if len(reads.asked) == 2 and subscription is not None:
            subscription.close()

    reads = Reads(log, held=asyncio.Event(), on_ask=close_at_the_second_read)
    log.read = reads  # type: ignore[method-assign]
    sent: list[int] = []

    def send(frame: str, _committed: float = 0.0) -> bool:
        sent.append(seq_of(frame))
        return True

    subscription = Subscription(
        thread_id=thread_id, after_seq=0, bus=bus, log=log, send_replay=send, send_live=send
    )
    before = asyncio.all_tasks()
    subscription.start()
    assert subscription.task is not None
    await asyncio.wait_for(asyncio.gather(subscription.task, return_exceptions=True), 10)
    await asyncio.sleep(0)
    assert subscription.task.cancelled()
    assert reads.asked == [0, FIRST_REPLAY_PAGE]
    # Cancelled before it sent anything, and the read of the next page with it.
    assert sent == []
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()
