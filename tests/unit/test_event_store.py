"""The event log on the Store (persistence/events.py through persistence/store.py): a long
thread written and replayed page by page keeps dense seqs, the stored rows and byte-identical
frames, with a statement observer installed on the store's engines or not; an in-memory SQLite
database is refused; SQLite writes run on the event loop's thread while the write lock is free
and on the writer lane's thread while another connection holds it; and one batch across many
threads keeps every thread's log dense."""

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

from gateway.event_log.bus import EventBus
from gateway.event_log.logged_event import LoggedEvent, encode_page
from gateway.event_log.writer import EventLog
from persistence.backends import open_store
from persistence.events import FEW_THREADS, EventRecord
from persistence.prepared import PreparedIn
from persistence.store import DatabaseConfigError, Store
from persistence.threads import ThreadRepository
from tests.support.storage import migrated_store

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
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with migrated_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        yield store


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


async def test_a_long_thread_replays_exactly_with_and_without_a_statement_observer(
    store: Store,
) -> None:
    thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
    log = EventLog(store, EventBus())
    await log.start()
    statements: list[str] = []

    def observe(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    engines = list(store.statement_engines())
    try:
        # Half written as production writes, half while a statement observer is installed
        # (as SQL tracing or the tests' storage faults are): the observer sees the appends, and
        # the log is the same either way.
        plain = await fill(log, thread.thread_id, 0, EVENTS // 2)
        for engine in engines:
            event.listen(engine, "before_cursor_execute", observe)
        try:
            observed = await fill(log, thread.thread_id, EVENTS // 2, EVENTS // 2)
            assert any(s.startswith("INSERT INTO events") for s in statements)
            reads_from = len(statements)
            replayed_observed = await replay(log, thread.thread_id)
            assert any(
                s.startswith("SELECT") and "FROM events" in s for s in statements[reads_from:]
            )
        finally:
            for engine in engines:
                event.remove(engine, "before_cursor_execute", observe)
        seen = len(statements)
        replayed = await replay(log, thread.thread_id)
        assert len(statements) == seen  # removed: it sees nothing more
    finally:
        await log.close()

    written = plain + observed
    assert [e.seq for e in written] == list(range(1, EVENTS + 1))
    assert replayed == replayed_observed == written
    for i, logged in enumerate(replayed):
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


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///:memory:",
        "sqlite://",
        "sqlite+aiosqlite:///:memory:",
        "sqlite:///file:shared?mode=memory&cache=shared&uri=true",
    ],
)
def test_an_in_memory_sqlite_database_is_refused(url: str) -> None:
    """The store's connections (writer, readers, the async engine) could not share one."""
    with pytest.raises(DatabaseConfigError):
        open_store(url)


async def test_a_sqlite_file_is_accepted(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        assert store.backend == "sqlite"
        await store.ping()
    finally:
        await store.close()
    assert (tmp_path / "x.db").exists()


async def test_writes_run_inline_and_wait_on_their_thread_for_a_lock_held_elsewhere(
    store: Store, tmp_path: Path
) -> None:
    thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
    log = EventLog(store, EventBus())
    await log.start()
    loop_thread = threading.get_ident()

    def where(_conn: Any) -> int:
        return threading.get_ident()

    try:
        # The write lock is free: the transaction runs right on the event loop's thread.
        assert (await log.commit(action=where))[0] == loop_thread
        # Another connection (a peer process, say) holds the write lock.
        blocker = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            event_ = log.new_event(thread.thread_id, None, "x", {"n": 1})
            pending = asyncio.ensure_future(log.commit([event_], action=where))
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
        assert (await log.commit(action=where))[0] == loop_thread
        assert [e.seq for e in await log.read(thread.thread_id, after_seq=0)] == [1]
    finally:
        await log.close()


@pytest.mark.parametrize(
    "width",
    [1, FEW_THREADS, FEW_THREADS + 1, PreparedIn.SIZES[1] + 1, PreparedIn.SIZES[-1] + 50],
    ids=lambda n: f"{n}",
)
async def test_one_batch_across_many_threads_keeps_each_log_dense(store: Store, width: int) -> None:
    """Both ways of bumping heads (a statement per thread, one for many) and the chunking."""
    repo = ThreadRepository(store)
    thread_ids = [(await repo.create(tenant="acme", owner="alice")).thread_id for _ in range(width)]
    log = EventLog(store, EventBus())
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
