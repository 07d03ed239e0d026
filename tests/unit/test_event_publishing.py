"""When the event log publishes what it stored: streamed commits on the loop's next turn, a
lifecycle commit at once unless earlier ones still wait; always in order, and always before the
committers' futures resolve (gateway/event_log/writer.py, `_publish_soon`)."""

from __future__ import annotations

import asyncio

from gateway.event_log.bus import EventBus
from gateway.event_log.logged_event import LoggedEvent
from gateway.event_log.writer import EventLog


async def test_every_commit_is_published_in_order_before_its_committer_goes_on(
    log_and_thread: tuple[EventLog, str, EventBus],
) -> None:
    log, thread_id, bus = log_and_thread
    published: list[int] = []
    stamps: list[float] = []

    def listener(events: object, committed: float) -> None:
        assert isinstance(events, list)
        published.extend(event.seq for event in events)
        stamps.append(committed)

    bus.subscribe(thread_id, listener)
    # Streamed events, then a lifecycle commit queued behind them before the writer runs (its
    # task is made first, so it queues its commit before the writer's turn): the writer takes
    # them in one turn, and the lifecycle commit's events must not overtake the streamed ones
    # still waiting for their turn to be published.
    paused = asyncio.create_task(
        log.commit([log.new_event(thread_id, "r_1", "run.paused", {})], None)
    )
    streamed = [
        await log.append(thread_id, "r_1", "tool.called", {"call_id": f"c{i}"}) for i in range(5)
    ]
    seen_by_committers: list[list[int]] = []
    for future in streamed:
        event: LoggedEvent = await future
        assert event.seq in published
        seen_by_committers.append(list(published))
    _, logged = await paused
    assert [event.seq for event in logged] == [6]
    assert published == [1, 2, 3, 4, 5, 6]
    # Each committer found its own events (and all before them) already published.
    assert all(seen[: n + 1] == list(range(1, n + 2)) for n, seen in enumerate(seen_by_committers))
    assert all(stamp > 0 for stamp in stamps)

    # A lifecycle commit alone: published before its committer goes on too.
    published.clear()
    _, logged = await log.commit([log.new_event(thread_id, "r_1", "run.resumed", {})], None)
    assert published == [7]
