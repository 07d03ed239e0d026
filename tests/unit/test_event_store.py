"""The event log's direct SQLite path (persistence/events.py `SqliteEventStore`) against the
SQLAlchemy path: the same seqs, the same stored rows and byte-identical frames, for a long
thread replayed page by page; and the SQLAlchemy path whenever statements are observed."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.bus import EventBus
from gateway.eventlog import EventLog
from gateway.eventlog_types import LoggedEvent, encode_page
from persistence.db import create_engine
from persistence.events import FEW_THREADS, HEADS_PER_STATEMENT, EventRecord, SqliteEventStore
from persistence.threads import ThreadRepository
from tests.support.storage import migrated_engine

EVENTS = 10_000


def sample(i: int) -> tuple[str | None, str, dict[str, Any]]:
    """A varied event: run ids and none, several types, text that needs escaping."""
    run_id = None if i % 97 == 0 else f"r_{i // 250}"
    if i % 250 == 0:
        return run_id, "run.started", {"input": f'story {i} \u2014 "quoted"', "agent": "a"}
    if i % 50 == 0:
        return run_id, "tool.called", {"call_id": f"c{i}", "arguments": {"x": [i, None, 1.5]}}
    # A message id per delta: queued deltas of one message would be merged (and counted once).
    return run_id, "message.delta", {"message_id": f"m_{i}", "delta": f"w{i}\n\u00e9 "}


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(tmp_path / "store.db") as engine:
        yield engine


async def fill(log: EventLog, thread_id: str, start: int, count: int) -> list[LoggedEvent]:
    futures = []
    for i in range(start, start + count):
        run_id, type_, data = sample(i)
        futures.append(await log.append(thread_id, run_id, type_, data))
    return list(await asyncio.gather(*futures))


async def replay(log: EventLog, thread_id: str) -> list[LoggedEvent]:
    seen: list[LoggedEvent] = []
    while True:
        page = await log.read(thread_id, after_seq=seen[-1].seq if seen else 0, limit=500)
        seen.extend(page)
        if len(page) < 500:
            return seen


async def test_a_long_thread_replays_exactly_on_both_paths(engine: AsyncEngine) -> None:
    thread = await ThreadRepository(engine).create(tenant="acme", owner="alice")
    log = EventLog(engine, EventBus())
    await log.start()
    statements: list[str] = []

    def observe(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    try:
        # Half written on the direct path, half while a statement observer is installed.
        direct = await fill(log, thread.thread_id, 0, EVENTS // 2)
        assert not any("INSERT INTO events" in s for s in statements)
        event.listen(engine.sync_engine, "before_cursor_execute", observe)
        try:
            observed = await fill(log, thread.thread_id, EVENTS // 2, EVENTS // 2)
            assert any("INSERT INTO events" in s for s in statements)
            via_sqlalchemy = await replay(log, thread.thread_id)
        finally:
            event.remove(engine.sync_engine, "before_cursor_execute", observe)
        via_direct = await replay(log, thread.thread_id)
    finally:
        await log.close()

    written = direct + observed
    assert [e.seq for e in written] == list(range(1, EVENTS + 1))
    assert via_direct == via_sqlalchemy == written
    for i, logged in enumerate(via_direct):
        run_id, type_, data = sample(i)
        frame = orjson.loads(logged.frame)
        assert frame == {
            "type": "event",
            "thread_id": thread.thread_id,
            "seq": i + 1,
            "run_id": run_id,
            "event": type_,
            "ts": logged.ts,
            "data": data,
        }


async def test_encode_page_matches_encoding_each_record() -> None:
    records = [
        EventRecord("t_1", seq, run_id, type_, "2026-11-29T12:00:00.000Z", orjson.dumps(d).decode())
        for seq, (run_id, type_, d) in enumerate(map(sample, range(1, 600)), start=1)
    ]
    assert encode_page(records) == [LoggedEvent.from_record(r) for r in records]


async def test_the_direct_path_is_only_for_sqlite_files(tmp_path: Path) -> None:
    memory = create_engine("sqlite+aiosqlite:///:memory:")
    file = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    try:
        assert SqliteEventStore.for_engine(memory) is None
        assert SqliteEventStore.for_engine(file) is not None
    finally:
        await memory.dispose()
        await file.dispose()


async def test_writes_run_inline_and_wait_on_their_thread_for_a_lock_held_elsewhere(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    thread = await ThreadRepository(engine).create(tenant="acme", owner="alice")
    log = EventLog(engine, EventBus())
    await log.start()
    loop_thread = threading.get_ident()

    def where(_db: Any) -> int:
        return threading.get_ident()

    try:
        # The write lock is free: the transaction runs right on the event loop's thread.
        assert (await log.commit(direct=where))[0] == loop_thread
        # Another connection (a peer process, the engine) holds the write lock.
        blocker = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            event_ = log.new_event(thread.thread_id, None, "x", {"n": 1})
            pending = asyncio.ensure_future(log.commit([event_], direct=where))
            ticks = 0
            for _ in range(10):
                await asyncio.sleep(0.02)
                ticks += 1
            assert ticks == 10 and not pending.done()  # the loop runs on while the write waits
        finally:
            blocker.execute("COMMIT")
            blocker.close()
        ran_on, logged = await asyncio.wait_for(pending, 10)
        assert ran_on != loop_thread  # it waited on the writer thread
        assert [e.seq for e in logged] == [1]
        # The lock is free again: back on the loop's thread, and nothing was lost.
        assert (await log.commit(direct=where))[0] == loop_thread
        assert [e.seq for e in await log.read(thread.thread_id, after_seq=0)] == [1]
    finally:
        await log.close()


@pytest.mark.parametrize(
    "width", [1, FEW_THREADS, FEW_THREADS + 1, HEADS_PER_STATEMENT + 50], ids=lambda n: f"{n}"
)
async def test_one_batch_across_many_threads_keeps_each_log_dense(
    engine: AsyncEngine, width: int
) -> None:
    """Both ways of bumping heads (a statement per thread, one for many) and the chunking."""
    repo = ThreadRepository(engine)
    thread_ids = [(await repo.create(tenant="acme", owner="alice")).thread_id for _ in range(width)]
    log = EventLog(engine, EventBus())
    await log.start()
    try:
        # Queued without yielding, so the writer takes them as one batch (more threads than
        # one statement bumps).
        futures = []
        for round_ in range(3):
            for thread_id in thread_ids:
                futures.append(await log.append(thread_id, None, "x", {"round": round_}))
        stored = await asyncio.gather(*futures)
        by_thread: dict[str, list[int]] = {}
        for event_ in stored:
            by_thread.setdefault(event_.thread_id, []).append(event_.seq)
        assert by_thread == {thread_id: [1, 2, 3] for thread_id in thread_ids}
        # A thread that does not exist fails its batch and stores nothing of it.
        lost = await log.append("t_missing", None, "x", {})
        kept = await log.append(thread_ids[0], None, "x", {})
        with pytest.raises(LookupError):
            await lost
        with pytest.raises(LookupError):
            await kept
        assert [e.seq for e in await log.read(thread_ids[0], after_seq=0)] == [1, 2, 3]
        again = await (await log.append(thread_ids[0], None, "x", {}))
        assert again.seq == 4
    finally:
        await log.close()
