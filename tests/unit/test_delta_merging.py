"""Merging queued text deltas in the event log writer (gateway/event_log/writer.py).

Pure checks of a queued delta taking more text, then the real writer on a real SQLite file:
merged text stays exact and in order, nothing merges across messages, the thread's other
events, atomic commits, runs or leases, other threads in between do not stop a merge, and an
idle writer stores each delta on its own without waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.event_log.bus import EventBus
from gateway.event_log.logged_event import LoggedEvent
from gateway.event_log.writer import (
    MAX_MERGED_DELTA_CHARS,
    EventClock,
    EventLog,
    _Plain,
    event_ts,
)
from persistence.events import NewEvent
from persistence.leases import Lease
from persistence.threads import ThreadRepository
from tests.support.storage import migrated_store, running_event_log

DELTA = "message.delta"


def delta_entry(text: str, *, run_id: str = "r_1", lease: Lease | None = None) -> _Plain:
    event = NewEvent("t_1", run_id, DELTA, event_ts(), "{}", lease)
    future: asyncio.Future[LoggedEvent] = asyncio.get_running_loop().create_future()
    return _Plain(event, future, message_id="m_1", parts=[text], size=len(text))


async def test_a_delta_takes_only_text_of_its_own_message_run_and_lease() -> None:
    old, new = Lease("r_1", "gw-a", 1), Lease("r_1", "gw-a", 2)
    entry = delta_entry("a", lease=old)
    assert entry.extend("r_1", old, "m_1", "b")
    assert not entry.extend("r_1", new, "m_1", "c")  # a newer lease: another attempt's text
    assert not entry.extend("r_9", old, "m_1", "c")
    assert not entry.extend("r_1", old, "m_2", "c")
    assert entry.parts == ["a", "b"]
    # The merged event is as old as its first delta.
    assert entry.stored_event().ts == entry.event.ts
    assert orjson.loads(entry.stored_event().data) == {"message_id": "m_1", "delta": "ab"}


async def test_a_single_delta_is_stored_untouched() -> None:
    entry = delta_entry("hello")
    assert entry.stored_event() is entry.event


async def test_a_merged_delta_stops_growing_at_the_cap() -> None:
    chunk = "x" * (MAX_MERGED_DELTA_CHARS // 2)
    entry = delta_entry(chunk)
    assert entry.extend("r_1", None, "m_1", chunk)
    assert not entry.extend("r_1", None, "m_1", "x")
    assert len(orjson.loads(entry.stored_event().data)["delta"]) == MAX_MERGED_DELTA_CHARS


# -- the writer on a real SQLite file -----------------------------------------------------------


@pytest.fixture
async def log_and_threads(tmp_path: Path) -> AsyncIterator[tuple[EventLog, str, str]]:
    async with migrated_store(f"sqlite:///{tmp_path / 'log.db'}") as store:
        first = await ThreadRepository(store).create(tenant="acme", owner="alice")
        second = await ThreadRepository(store).create(tenant="acme", owner="alice")
        async with running_event_log(store, EventBus()) as log:
            yield log, first.thread_id, second.thread_id


async def store_queued(
    log: EventLog, appends: list[tuple[str, str, dict[str, Any]]], run_id: str = "r_1"
) -> None:
    """Append everything without yielding to the loop in between (the writer finds it all
    queued at once, as under load), then wait until it is stored."""
    futures = [await log.append(thread, run_id, type_, data) for thread, type_, data in appends]
    await asyncio.wait_for(asyncio.gather(*futures), 10)


async def stored_in(log: EventLog, thread_id: str) -> list[tuple[str, str | None]]:
    events = await log.read(thread_id, after_seq=0)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    frames = [orjson.loads(e.frame) for e in events]
    return [(f["event"], f["data"].get("delta")) for f in frames]


def d(thread: str, message: str, text: str) -> tuple[str, str, dict[str, Any]]:
    return thread, DELTA, {"message_id": message, "delta": text}


async def test_queued_deltas_of_a_message_become_one_event_with_the_exact_text(
    log_and_threads: tuple[EventLog, str, str],
) -> None:
    log, t1, _ = log_and_threads
    words = ["Once ", "upon ", "a ", "time", ", ", "\u00e9t\u00e9 ", '"quoted" ', "\\n"]
    await store_queued(log, [d(t1, "m_1", word) for word in words])
    assert await stored_in(log, t1) == [(DELTA, "".join(words))]


async def test_deltas_merge_only_within_a_message_and_never_across_the_threads_other_events(
    log_and_threads: tuple[EventLog, str, str],
) -> None:
    log, t1, _ = log_and_threads
    tool = {"call_id": "c1", "tool_name": "x", "arguments": {}}
    await store_queued(
        log,
        [
            d(t1, "m_1", "a"),
            d(t1, "m_1", "b"),
            d(t1, "m_2", "c"),
            d(t1, "m_1", "d"),
            (t1, "tool.called", tool),
            d(t1, "m_1", "e"),
            (t1, "message.completed", {"message_id": "m_1", "text": "abde"}),
            d(t1, "m_1", "late"),
        ],
    )
    assert await stored_in(log, t1) == [
        (DELTA, "ab"),
        (DELTA, "c"),
        (DELTA, "d"),
        ("tool.called", None),
        (DELTA, "e"),
        ("message.completed", None),
        (DELTA, "late"),
    ]


async def test_other_threads_in_between_do_not_stop_a_merge_and_each_thread_keeps_its_order(
    log_and_threads: tuple[EventLog, str, str],
) -> None:
    log, t1, t2 = log_and_threads
    await store_queued(
        log,
        [
            d(t1, "m_1", "a1 "),
            d(t2, "m_2", "b1 "),
            d(t1, "m_1", "a2 "),
            (t2, "message.completed", {"message_id": "m_2", "text": "b1 "}),
            d(t1, "m_1", "a3"),
            d(t2, "m_3", "c1"),
        ],
    )
    assert await stored_in(log, t1) == [(DELTA, "a1 a2 a3")]
    assert await stored_in(log, t2) == [(DELTA, "b1 "), ("message.completed", None), (DELTA, "c1")]


async def test_no_delta_joins_one_queued_before_an_atomic_commit(
    log_and_threads: tuple[EventLog, str, str],
) -> None:
    """Text produced after a commit (a checkpoint, say) is never stored before it."""
    log, t1, t2 = log_and_threads
    first = await log.append(t1, "r_1", DELTA, {"message_id": "m_1", "delta": "before "})
    other = await log.append(t2, "r_2", DELTA, {"message_id": "m_2", "delta": "x"})
    commit = asyncio.ensure_future(log.commit([log.new_event(t1, "r_1", "run.resumed", {})]))
    await asyncio.sleep(0)  # the commit is queued behind the deltas
    after = await log.append(t1, "r_1", DELTA, {"message_id": "m_1", "delta": "after"})
    late = await log.append(t2, "r_2", DELTA, {"message_id": "m_2", "delta": "y"})
    await asyncio.wait_for(asyncio.gather(first, other, commit, after, late), 10)
    assert await stored_in(log, t1) == [(DELTA, "before "), ("run.resumed", None), (DELTA, "after")]
    assert await stored_in(log, t2) == [(DELTA, "x"), (DELTA, "y")]
    assert (await first).seq == 1 and (await after).seq == 3


async def test_an_idle_writer_stores_each_delta_at_once(
    log_and_thread: tuple[EventLog, str, EventBus],
) -> None:
    log, thread_id, _ = log_and_thread
    for word in ["one ", "two ", "three"]:
        future = await log.append(thread_id, "r_1", DELTA, {"message_id": "m_1", "delta": word})
        # Stored on its own, without waiting for more deltas to merge with.
        event = await asyncio.wait_for(future, 10)
        assert orjson.loads(event.frame)["data"]["delta"] == word
    events = await log.read(thread_id, after_seq=0)
    assert [e.seq for e in events] == [1, 2, 3]


async def test_a_busy_writer_merges_queued_deltas_exactly(
    log_and_thread: tuple[EventLog, str, EventBus],
) -> None:
    log, thread_id, bus = log_and_thread
    published: list[LoggedEvent] = []
    bus.subscribe(thread_id, lambda events, _committed: published.extend(events))
    words = [f"w{i} " for i in range(300)]
    futures = []
    # Nothing awaits between appends, so the writer finds them all queued at once.
    futures.append(
        await log.append(thread_id, "r_1", "message.started", {"message_id": "m_1", "agent": "a"})
    )
    for word in words:
        futures.append(
            await log.append(thread_id, "r_1", DELTA, {"message_id": "m_1", "delta": word})
        )
    futures.append(
        await log.append(
            thread_id, "r_1", "message.completed", {"message_id": "m_1", "text": "".join(words)}
        )
    )
    results = await asyncio.wait_for(asyncio.gather(*futures), 10)
    events = await log.read(thread_id, after_seq=0)
    frames = [orjson.loads(e.frame) for e in events]
    kinds = [f["event"] for f in frames]
    assert kinds[0] == "message.started" and kinds[-1] == "message.completed"
    assert len(events) < len(futures)  # merged
    assert "".join(f["data"]["delta"] for f in frames if f["event"] == DELTA) == "".join(words)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # Subscribers got exactly what was stored, and every caller a stored event.
    assert [e.frame for e in published] == [e.frame for e in events]
    assert {r.seq for r in results} == {e.seq for e in events}


def test_the_event_clock_stamps_like_event_ts() -> None:
    clock = EventClock()
    for _ in range(3):
        before = time.time()
        stamped = clock.now()
        after = time.time()
        # Millisecond resolution, UTC, the protocol's `ts` format.
        moment = datetime.strptime(stamped, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        assert int(before * 1000) / 1000 <= moment.timestamp() <= after + 0.001
        assert len(stamped) == len(event_ts()) == 24
        time.sleep(0.6)  # across a second boundary at least once


async def test_a_delta_that_carries_more_than_its_text_stays_whole(
    log_and_threads: tuple[EventLog, str, str],
) -> None:
    log, t1, _ = log_and_threads
    await store_queued(
        log,
        [
            d(t1, "m_1", "a"),
            (t1, DELTA, {"message_id": "m_1", "delta": "b", "logprob": -0.1}),
            d(t1, "m_1", "c"),
            (t1, DELTA, {"message_id": "m_1"}),
            d(t1, "m_1", "d"),
        ],
    )
    events = await log.read(t1, after_seq=0)
    datas = [orjson.loads(e.frame)["data"] for e in events]
    assert datas == [
        {"message_id": "m_1", "delta": "a"},
        {"message_id": "m_1", "delta": "b", "logprob": -0.1},
        {"message_id": "m_1", "delta": "c"},
        {"message_id": "m_1"},
        {"message_id": "m_1", "delta": "d"},
    ]


# -- the merge window (GATEWAY_DELTA_MERGE_MS) ---------------------------------------------------

WINDOW_S = 2.0  # long beside a commit, even on a loaded machine


@pytest.fixture
async def windowed(tmp_path: Path) -> AsyncIterator[tuple[EventLog, str, list[LoggedEvent]]]:
    """A writer holding deltas for WINDOW_S, and what its bus published (in order)."""
    async with migrated_store(f"sqlite:///{tmp_path / 'log.db'}") as store:
        thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
        bus = EventBus()
        published: list[LoggedEvent] = []
        bus.subscribe(thread.thread_id, lambda events, _committed: published.extend(events))
        async with running_event_log(store, bus, merge_s=WINDOW_S) as log:
            yield log, thread.thread_id, published


async def test_deltas_paced_within_the_window_go_out_as_one_event(
    windowed: tuple[EventLog, str, list[LoggedEvent]],
) -> None:
    log, thread_id, published = windowed
    began = time.monotonic()
    futures = []
    for word in ["one ", "two ", "three"]:
        futures.append(
            await log.append(thread_id, "r_1", DELTA, {"message_id": "m", "delta": word})
        )
        await asyncio.sleep(0.02)  # a model's pace: the writer is idle in between
    stored = await asyncio.wait_for(asyncio.gather(*futures), 10)
    waited = time.monotonic() - began
    assert {event.seq for event in stored} == {1}
    assert [orjson.loads(e.frame)["data"]["delta"] for e in published] == ["one two three"]
    # Held for the window from the first delta, then stored: not before, not much after.
    assert WINDOW_S <= waited < WINDOW_S + 5


async def test_an_atomic_commit_ends_the_wait_and_keeps_the_order(
    windowed: tuple[EventLog, str, list[LoggedEvent]],
) -> None:
    log, thread_id, published = windowed
    delta = await log.append(thread_id, "r_1", DELTA, {"message_id": "m", "delta": "text"})
    await asyncio.sleep(0)  # the writer takes the delta and starts holding it
    began = time.monotonic()
    _, (paused,) = await log.commit([log.new_event(thread_id, "r_1", "run.paused", {})])
    ended = time.monotonic() - began
    assert (await delta).seq == 1 and paused.seq == 2
    assert [orjson.loads(e.frame)["event"] for e in published] == [DELTA, "run.paused"]
    # The pause did not wait out the window (a loaded machine may still take a while).
    assert ended < WINDOW_S


async def test_closing_ends_the_wait_and_stores_what_was_held(tmp_path: Path) -> None:
    async with migrated_store(f"sqlite:///{tmp_path / 'log.db'}") as store:
        thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
        log = EventLog(store, EventBus(), merge_s=30.0)
        await log.start()
        held = await log.append(thread.thread_id, "r_1", DELTA, {"message_id": "m", "delta": "x"})
        await asyncio.sleep(0)
        await asyncio.wait_for(log.close(), 10)
        assert (await held).seq == 1
