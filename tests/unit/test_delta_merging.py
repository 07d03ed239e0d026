"""Merging queued text deltas in the event log writer (gateway/eventlog.py).

Pure checks of `merge_deltas` on queued entries, then the real writer on a real SQLite file:
merged text stays exact and in order, nothing merges across messages, threads' other events,
leases or event types, and an idle writer stores each delta on its own without waiting.
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

from gateway.bus import EventBus
from gateway.eventlog import (
    MAX_MERGED_DELTA_CHARS,
    EventClock,
    EventLog,
    _Plain,
    event_ts,
    merge_deltas,
)
from gateway.eventlog_types import LoggedEvent
from persistence.events import NewEvent
from persistence.leases import Lease
from persistence.threads import ThreadRepository
from tests.support.storage import migrated_engine, running_event_log

DELTA = "message.delta"


def plain(
    thread_id: str,
    type_: str,
    data: dict[str, Any],
    *,
    run_id: str = "r_1",
    lease: Lease | None = None,
) -> _Plain:
    event = NewEvent(thread_id, run_id, type_, event_ts(), orjson.dumps(data).decode(), lease)
    future: asyncio.Future[LoggedEvent] = asyncio.get_running_loop().create_future()
    delta = (data["message_id"], data["delta"]) if type_ == DELTA else None
    return _Plain(event, future, delta)


def delta(thread_id: str, message_id: str, text: str, **kwargs: Any) -> _Plain:
    return plain(thread_id, DELTA, {"message_id": message_id, "delta": text}, **kwargs)


def stored(groups: list[Any]) -> list[tuple[str, str, dict[str, Any]]]:
    events = [group.stored_event() for group in groups]
    return [(e.thread_id, e.type, orjson.loads(e.data)) for e in events]


# -- merge_deltas --------------------------------------------------------------------------------


async def test_consecutive_deltas_of_a_message_become_one_with_the_exact_text() -> None:
    words = ["Once ", "upon ", "a ", "time", ", ", "\u00e9t\u00e9 ", '"quoted" ', "\\n"]
    entries = [delta("t_1", "m_1", word) for word in words]
    groups = merge_deltas(entries)
    assert stored(groups) == [("t_1", DELTA, {"message_id": "m_1", "delta": "".join(words)})]
    # Every queued caller is answered with the one stored event.
    assert groups[0].futures == [e.future for e in entries]
    # The merged event is as old as its first delta.
    assert groups[0].stored_event().ts == entries[0].event.ts


async def test_a_single_delta_is_stored_untouched() -> None:
    entry = delta("t_1", "m_1", "hello")
    [group] = merge_deltas([entry])
    assert group.stored_event() is entry.event


async def test_deltas_of_different_messages_are_not_merged() -> None:
    entries = [
        delta("t_1", "m_1", "a"),
        delta("t_1", "m_1", "b"),
        delta("t_1", "m_2", "c"),
        delta("t_1", "m_1", "d"),
    ]
    assert [d["delta"] for _, _, d in stored(merge_deltas(entries))] == ["ab", "c", "d"]


async def test_nothing_merges_across_another_event_of_the_same_thread() -> None:
    entries = [
        delta("t_1", "m_1", "a"),
        plain("t_1", "tool.called", {"call_id": "c1", "tool_name": "x", "arguments": {}}),
        delta("t_1", "m_1", "b"),
        plain("t_1", "message.completed", {"message_id": "m_1", "text": "ab"}),
        delta("t_1", "m_1", "late"),
    ]
    assert [(t, d.get("delta")) for _, t, d in stored(merge_deltas(entries))] == [
        (DELTA, "a"),
        ("tool.called", None),
        (DELTA, "b"),
        ("message.completed", None),
        (DELTA, "late"),
    ]


async def test_other_threads_in_between_do_not_stop_a_merge_and_each_thread_keeps_its_order() -> (
    None
):
    entries = [
        delta("t_1", "m_1", "a1 "),
        delta("t_2", "m_2", "b1 ", run_id="r_2"),
        delta("t_1", "m_1", "a2 "),
        plain("t_2", "message.completed", {"message_id": "m_2", "text": "b1 "}, run_id="r_2"),
        delta("t_1", "m_1", "a3"),
        delta("t_2", "m_3", "c1", run_id="r_2"),
    ]
    rows = stored(merge_deltas(entries))
    assert [(thread, d.get("delta")) for thread, _, d in rows if thread == "t_1"] == [
        ("t_1", "a1 a2 a3")
    ]
    assert [(t, d.get("delta")) for thread, t, d in rows if thread == "t_2"] == [
        (DELTA, "b1 "),
        ("message.completed", None),
        (DELTA, "c1"),
    ]


async def test_deltas_under_different_runs_or_leases_are_not_merged() -> None:
    old, new = Lease("r_1", "gw-a", 1), Lease("r_1", "gw-a", 2)
    entries = [
        delta("t_1", "m_1", "a", lease=old),
        delta("t_1", "m_1", "b", lease=new),
        delta("t_1", "m_1", "c", lease=new, run_id="r_9"),
    ]
    assert [d["delta"] for _, _, d in stored(merge_deltas(entries))] == ["a", "b", "c"]


async def test_a_merged_delta_stops_growing_at_the_cap() -> None:
    chunk = "x" * (MAX_MERGED_DELTA_CHARS // 3)
    entries = [delta("t_1", "m_1", chunk) for _ in range(7)]
    texts = [d["delta"] for _, _, d in stored(merge_deltas(entries))]
    assert "".join(texts) == chunk * 7
    assert len(texts) > 1
    assert all(len(text) <= MAX_MERGED_DELTA_CHARS for text in texts)


# -- the writer on a real SQLite file -----------------------------------------------------------


@pytest.fixture
async def log_and_thread(tmp_path: Path) -> AsyncIterator[tuple[EventLog, str, EventBus]]:
    bus = EventBus()
    async with migrated_engine(tmp_path / "log.db") as engine:
        thread = await ThreadRepository(engine).create(tenant="acme", owner="alice")
        async with running_event_log(engine, bus) as log:
            yield log, thread.thread_id, bus


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
    bus.subscribe(thread_id, published.extend)
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
