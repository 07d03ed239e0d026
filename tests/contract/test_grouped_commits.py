"""Commits queued together share one transaction, each in a savepoint of its own
(`Store.commit_parts`, and the event log's writer that uses it): a part refused (a lost lease, a
failing action, an integrity error) is rolled back alone, the others are stored in the order
they were queued, and the log stays dense. Run on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gateway.event_log.bus import EventBus
from gateway.event_log.writer import EventLog
from persistence.events import NewEvent
from persistence.leases import LeaseLost, LeaseRepository
from persistence.store import Part, PartStored, Store
from persistence.tables import events, threads
from persistence.threads import ThreadRepository
from tests.support.storage import expire_lease, insert_running_run, migrated_store, observed

pytestmark = pytest.mark.both_backends

TS = "2026-01-01T00:00:00.000Z"


class Refused(Exception):
    pass


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    async with migrated_store(database_url) as store:
        yield store


def event(thread_id: str, n: int, lease: Any = None) -> NewEvent:
    return NewEvent(thread_id, None, "test.event", TS, f'{{"n":{n}}}', lease)


async def new_threads(store: Store, count: int) -> list[str]:
    repo = ThreadRepository(store)
    return [(await repo.create(tenant="acme", owner="alice")).thread_id for _ in range(count)]


async def logged(store: Store, thread_id: str) -> list[tuple[int, str]]:
    query = (
        select(events.c.seq, events.c.data)
        .where(events.c.thread_id == thread_id)
        .order_by(events.c.seq)
    )
    return await store.read(lambda conn: [tuple(row) for row in conn.execute(query)])


async def title(store: Store, thread_id: str) -> str | None:
    query = select(threads.c.title).where(threads.c.thread_id == thread_id)
    return await store.read(lambda conn: conn.execute(query).scalar_one())


def retitle(thread_id: str, to: str, *, then: BaseException | None = None) -> Any:
    """An action that changes a row, then (with `then`) fails after having changed it."""

    def action(conn: Connection) -> str:
        conn.execute(update(threads).where(threads.c.thread_id == thread_id).values(title=to))
        if then is not None:
            raise then
        return to

    return action


def duplicate_event(thread_id: str) -> Any:
    """An action that breaks the log's primary key: an integrity error from the database."""

    def action(conn: Connection) -> None:
        row = {"thread_id": thread_id, "seq": 1, "run_id": None, "type": "x", "ts": TS}
        conn.execute(events.insert().values(**row, data="{}"))
        conn.execute(events.insert().values(**row, data="{}"))

    return action


async def test_a_refused_part_is_rolled_back_alone(store: Store) -> None:
    a, b = await new_threads(store, 2)
    outcomes = await store.commit_parts(
        [
            Part([event(a, 1), event(a, 2)], None, None, atomic=False),
            Part([event(b, 1)], retitle(b, "never", then=Refused("no")), None, atomic=True),
            Part([event(b, 2)], retitle(b, "kept"), None, atomic=True),
            Part([event(a, 3)], duplicate_event(a), None, atomic=True),
            Part([event(a, 4)], None, None, atomic=False),
        ]
    )
    stored, refused, kept, broken, last = outcomes
    assert isinstance(stored, PartStored) and [r.seq for r in stored.records] == [1, 2]
    assert isinstance(refused, Refused)
    assert isinstance(kept, PartStored) and kept.result == "kept"
    assert isinstance(broken, IntegrityError)
    assert isinstance(last, PartStored) and [r.seq for r in last.records] == [3]
    # Dense, in queue order, without the refused parts' events or changes.
    assert await logged(store, a) == [(1, '{"n":1}'), (2, '{"n":2}'), (3, '{"n":4}')]
    assert await logged(store, b) == [(1, '{"n":2}')]
    assert await title(store, b) == "kept"


async def test_a_lost_lease_refuses_its_part_only(store: Store) -> None:
    (thread_id,) = await new_threads(store, 1)
    await insert_running_run(store, "r_group", thread_id)
    leases = LeaseRepository(store)
    old = await leases.acquire("r_group", "gw-a", ttl_s=30)
    await expire_lease(store, "r_group")
    new = await leases.acquire("r_group", "gw-b", ttl_s=30)
    assert old is not None and new is not None
    streamed, fenced, current = await store.commit_parts(
        [
            Part([event(thread_id, 1, old), event(thread_id, 2, new)], None, None, atomic=False),
            Part([event(thread_id, 3, old)], None, None, atomic=True),
            Part([event(thread_id, 4, new)], None, None, atomic=True),
        ]
    )
    assert isinstance(streamed, PartStored) and streamed.lost == {old}
    assert isinstance(fenced, LeaseLost)
    assert isinstance(current, PartStored)
    assert await logged(store, thread_id) == [(1, '{"n":2}'), (2, '{"n":4}')]


async def test_commits_queued_together_share_a_transaction(store: Store) -> None:
    """Through the event log: streamed events and atomic commits queued while the writer is
    busy are stored in one transaction (savepoints seen), each caller gets its own outcome,
    and the log keeps the order they were queued in."""
    threads_ = await new_threads(store, 3)
    savepoints: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("SAVEPOINT"):
            savepoints.append(statement)

    engines = store.statement_engines()
    for engine in engines:
        sa_event.listen(engine, "before_cursor_execute", seen)
    log = EventLog(store, EventBus())
    try:
        # Queued before the writer starts: it takes them all as one batch.
        streamed = [await log.append(t, None, "test.event", {"n": 0}) for t in threads_]
        commits = [
            asyncio.ensure_future(log.commit([log.new_event(t, None, "test.done", {})], action))
            for t, action in zip(
                threads_,
                [retitle(threads_[0], "one"), retitle(threads_[1], "x", then=Refused()), None],
                strict=True,
            )
        ]
        await asyncio.sleep(0)  # each commit is queued
        after = [await log.append(t, None, "test.after", {}) for t in threads_]
        await log.start()
        done = await asyncio.gather(*streamed, *commits, *after, return_exceptions=True)
    finally:
        await log.close()
        for engine in engines:
            sa_event.remove(engine, "before_cursor_execute", seen)
    assert savepoints, "the queued commits were not grouped"
    outcomes = done[3:6]
    assert outcomes[0][0] == "one"  # type: ignore[index]
    assert isinstance(outcomes[1], Refused)
    assert outcomes[2][0] is None  # type: ignore[index]
    for t, types in zip(
        threads_,
        [
            ["test.event", "test.done", "test.after"],
            ["test.event", "test.after"],
            ["test.event", "test.done", "test.after"],
        ],
        strict=True,
    ):
        query = select(events.c.seq, events.c.type).where(events.c.thread_id == t)
        rows = await store.read(lambda conn, q=query: list(conn.execute(q.order_by(events.c.seq))))
        assert [row.type for row in rows] == types
        assert [row.seq for row in rows] == list(range(1, len(types) + 1))


async def test_each_part_opens_its_savepoint_in_one_round_trip(store: Store) -> None:
    """Releasing a part's savepoint goes with opening the next one's, and the COMMIT releases
    the last: on PostgreSQL one statement (one round trip) a part, where it was two."""
    a, b = await new_threads(store, 2)
    with observed(store) as statements:
        outcomes = await store.commit_parts(
            [
                Part([event(a, 1)], None, None, atomic=False),
                Part([event(b, 1)], retitle(b, "never", then=Refused("no")), None, atomic=True),
                Part([event(b, 2)], None, None, atomic=True),
            ]
        )
    assert [type(o) for o in outcomes] == [PartStored, Refused, PartStored]
    savepoints = [s for s in statements if "SAVEPOINT" in s and "ROLLBACK" not in s]
    if store.backend == "postgresql":
        assert savepoints == [
            "SAVEPOINT gateway_part",
            "RELEASE SAVEPOINT gateway_part; SAVEPOINT gateway_part",
            "RELEASE SAVEPOINT gateway_part; SAVEPOINT gateway_part",
        ]
    assert [s for s in statements if "ROLLBACK" in s] == ["ROLLBACK TO SAVEPOINT gateway_part"]
    assert await logged(store, a) == [(1, '{"n":1}')]
    assert await logged(store, b) == [(1, '{"n":2}')]
    assert await title(store, b) is None
