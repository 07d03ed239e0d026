"""PostgreSQL's statement path (persistence/prepared.py, persistence/postgres/store.py): the
repositories' prepared statements run on asyncpg's own connection inside the Store's
transaction, the engine's statement observers see each of them, and a pooled connection the
server closed is replaced at checkout rather than failing the next transaction."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from typing import Any, cast

import asyncpg
import pytest
from agents.extensions.memory import SQLAlchemySession
from agents.items import TResponseInputItem
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.util import await_only

from persistence.clock import utcnow
from persistence.events import NewEvent
from persistence.leases import LeaseRepository
from persistence.postgres.store import POOL_OVERFLOW, POOL_SIZE
from persistence.sessions import GatewaySession
from persistence.store import Store
from persistence.tables import events, threads
from persistence.threads import ThreadRepository
from tests.support.postgres import SERVER_URL, postgres_database
from tests.support.storage import expire_lease, insert_running_run, migrated_store, observed

pytestmark = pytest.mark.postgres

TS = "2026-01-01T00:00:00.000Z"


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    async with postgres_database() as url, migrated_store(url) as store:
        yield store


async def admin() -> asyncpg.Connection:
    return await asyncpg.connect(
        make_url(SERVER_URL).set(drivername="postgresql").render_as_string(hide_password=False)
    )


async def idle_in_transaction(store: Store) -> int:
    """How many of the store's connections the server sees idle inside a transaction."""
    server = await admin()
    try:
        return int(
            await server.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
                "AND state LIKE 'idle in transaction%'",
                store.url.database,
            )
        )
    finally:
        await server.close()


async def test_prepared_statements_run_in_the_transaction_and_are_observed(store: Store) -> None:
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    with observed(store) as seen:
        batch = [NewEvent(thread_id, None, "test.event", TS, f'{{"n":{n}}}') for n in range(3)]
        records, lost = await store.append(batch)

        def fail_after_append(conn: Any) -> None:
            raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            await store.commit(
                [NewEvent(thread_id, None, "test.lost", TS, "{}")], fail_after_append
            )
    assert [r.seq for r in records] == [1, 2, 3] and not lost
    # One thread's batch: the head bump and the rows, one statement (one round trip), observed.
    append = seen[0]
    assert "UPDATE threads" in append and "INSERT INTO events" in append
    assert len(seen) == 1
    query = select(events.c.type).where(events.c.thread_id == thread_id)
    stored = await store.read(lambda conn: list(conn.execute(query).scalars()))
    assert stored == ["test.event"] * 3  # the failed commit's event rolled back with it


def in_transaction(conn: Any) -> bool:
    """Whether a statement run on `conn` runs inside a transaction (the adapter begins one
    at a connection's first statement, if it begins one at all)."""
    conn.execute(select(1))
    return bool(conn.connection.driver_connection.is_in_transaction())


async def test_reads_and_single_statement_writes_run_without_a_transaction(
    store: Store,
) -> None:
    """Each is one round trip: no BEGIN before it, no COMMIT or ROLLBACK after it."""
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    assert await store.write(in_transaction)
    assert not await store.read(in_transaction)
    bump = threads.update().where(threads.c.thread_id == thread_id).values(head_seq=7)

    def single(conn: Any) -> bool:
        conn.execute(bump)
        return bool(conn.connection.driver_connection.is_in_transaction())

    assert not await store.write(single, single_statement=True)
    assert (await ThreadRepository(store).get(thread_id)).head_seq == 7  # type: ignore[union-attr]
    duplicate = threads.insert().values(
        thread_id=thread_id, tenant="acme", owner="a", created_at=utcnow()
    )
    with pytest.raises(IntegrityError):
        await store.write(lambda conn: conn.execute(duplicate), single_statement=True)
    assert await store.write(in_transaction)  # the pool's connections are as they were


async def test_a_connection_the_server_closed_is_replaced_at_checkout(store: Store) -> None:
    await store.ping()  # a pooled connection, idle now
    database = store.url.database
    server = await admin()
    try:
        terminated = await server.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await server.close()
    assert terminated >= 1
    await asyncio.sleep(0.2)  # the server's end of the socket reaches the loop
    await store.ping()  # no StorageUnavailable: a new connection was checked out
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    assert thread_id


async def test_a_connection_left_inside_a_transaction_is_replaced_and_its_locks_released(
    store: Store,
) -> None:
    """What a task cancelled while asyncpg sends a transaction's BEGIN leaves behind: asyncpg
    holds the transaction (and here the run row it locked), SQLAlchemy never learnt of it.
    The connection must not serve again: its locks would stall other writers for good."""
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    run_id = "r_left_in_a_transaction"
    await insert_running_run(store, run_id, thread_id)
    async with store.engine.connect() as left, store.engine.connect() as other:
        await other.exec_driver_sql("SELECT 1")
        await other.close()  # back in the pool first: the next checkout takes it
        adapter = (await left.get_raw_connection()).dbapi_connection
        driver = adapter.driver_connection
        transaction = driver.transaction()
        await transaction.start()  # BEGIN, as a cancelled start leaves it, unknown to SQLAlchemy
        await driver.execute("SELECT 1 FROM runs WHERE run_id = $1 FOR SHARE", run_id)
        assert adapter._transaction is None and driver.is_in_transaction()
    # Returned to the pool (SQLAlchemy's rollback does nothing there), where it would idle
    # holding the lock while the other connection's write waits for it.
    leases = LeaseRepository(store)
    lease = await asyncio.wait_for(leases.acquire(run_id, "gw-a", ttl_s=15), 10)
    assert lease is not None and lease.owner == "gw-a"
    assert await idle_in_transaction(store) == 0


async def test_a_session_append_is_one_statement_the_sdk_reads_back(store: Store) -> None:
    """The SDK's own `SQLAlchemySession` reads what the one-statement append wrote, in order,
    whether the append made the session's row or touched it."""
    ours = GatewaySession("t_pg", store=store)
    sdk = SQLAlchemySession("t_pg", engine=store.engine)
    items = [
        cast(TResponseInputItem, {"role": "user", "content": f'message {n} \u00e9 "quoted"'})
        for n in range(7)
    ]
    with observed(store) as statements:
        await ours.add_items(items[:4])  # makes the session's row
        await ours.add_items(items[4:6])  # touches it
    await sdk.add_items(items[6:])
    assert len(statements) == 2
    assert all("INSERT INTO agent_sessions" in s and "agent_messages" in s for s in statements)
    assert await sdk.get_items() == await ours.get_items() == items
    assert await ours.get_items(3) == items[4:]
    sessions = await store.read(
        lambda conn: conn.exec_driver_sql("SELECT session_id FROM agent_sessions").all()
    )
    assert [tuple(row) for row in sessions] == [("t_pg",)]


async def test_a_fenced_batch_over_several_threads_is_one_statement(store: Store) -> None:
    """Streamed events of several threads and runs, interleaved, one of their leases lost: one
    statement stores the others with each thread's seqs in batch order, and names the lost
    lease."""
    repo = ThreadRepository(store)
    a, b = [(await repo.create(tenant="acme", owner="a")).thread_id for _ in range(2)]
    leases = LeaseRepository(store)
    await insert_running_run(store, "r_a", a)
    await insert_running_run(store, "r_b", b)
    held = await leases.acquire("r_a", "gw-a", ttl_s=30)
    old = await leases.acquire("r_b", "gw-a", ttl_s=30)
    await expire_lease(store, "r_b")
    taken = await leases.acquire("r_b", "gw-b", ttl_s=30)
    assert held is not None and old is not None and taken is not None
    batch = [
        NewEvent(a, "r_a", "test.event", TS, '{"n":1}', held),
        NewEvent(b, "r_b", "test.event", TS, '{"n":2}', old),
        NewEvent(a, None, "test.event", TS, '{"n":3}'),
        NewEvent(b, "r_b", "test.event", TS, '{"n":4}', taken),
        NewEvent(a, "r_a", "test.event", TS, '{"n":5}', held),
    ]
    with observed(store) as seen:
        records, lost = await store.append(batch)
    assert len(seen) == 1
    assert lost == {old}
    assert [(r.thread_id, r.seq, r.data) for r in records] == [
        (a, 1, '{"n":1}'),
        (a, 2, '{"n":3}'),
        (b, 1, '{"n":4}'),
        (a, 3, '{"n":5}'),
    ]
    query = select(events.c.thread_id, events.c.seq, events.c.run_id, events.c.data)
    stored = await store.read(lambda conn: [tuple(row) for row in conn.execute(query)])
    assert sorted(stored) == sorted((r.thread_id, r.seq, r.run_id, r.data) for r in records)
    assert [(await repo.get(t)).head_seq for t in (a, b)] == [3, 1]  # type: ignore[union-attr]


async def test_a_store_call_closes_its_connection_without_a_task_of_its_own(
    store: Store,
) -> None:
    """SQLAlchemy's `async with` closes a connection in a task of its own: two more turns of a
    busy event loop for every call. A call that succeeded has nothing to roll back, so the
    store closes its connection in place."""
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    loop = asyncio.get_running_loop()
    created: list[str] = []
    previous = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        created.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(counting)
    try:
        await store.read(partial(ThreadRepository.get_in, thread_id=thread_id))
        await store.append([NewEvent(thread_id, None, "test.event", TS, "{}")])
        await store.write(lambda conn: conn.execute(select(1)))
    finally:
        loop.set_task_factory(previous)
    assert created == []
    assert store.engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_a_cancelled_call_gives_its_connection_back_outside_any_transaction(
    store: Store,
) -> None:
    """Cancelled mid-statement, a call still rolls back and returns its connection, as
    SQLAlchemy's own close does it: no connection is left checked out or in a transaction."""
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    bump = threads.update().where(threads.c.thread_id == thread_id).values(head_seq=9)

    def slow(conn: Any) -> None:
        conn.execute(bump)
        conn.exec_driver_sql("SELECT pg_sleep(1)")

    task = asyncio.create_task(store.write(slow))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert (await ThreadRepository(store).get(thread_id)).head_seq == 0  # type: ignore[union-attr]
    assert await idle_in_transaction(store) == 0


async def test_the_event_logs_writes_never_wait_for_a_connection_behind_other_work(
    store: Store,
) -> None:
    """Every connection of the pool is held (as when 200 runs start at once, each reading its
    thread and history): the event log's append and atomic commit still go through, on the
    writer's own connection, while all of those are still busy."""
    (thread_id,) = [(await ThreadRepository(store).create(tenant="acme", owner="a")).thread_id]
    pool = POOL_SIZE + POOL_OVERFLOW
    release = asyncio.Event()
    holding = 0
    all_held = asyncio.Event()

    async def hold(conn: Any) -> None:
        nonlocal holding
        holding += 1
        if holding == pool:
            all_held.set()
        await release.wait()

    def held_read(conn: Any) -> None:
        # A read that keeps its connection until released (the greenlet awaits the event).
        await_only(hold(conn))

    readers = [asyncio.create_task(store.read(held_read)) for _ in range(pool)]
    await asyncio.wait_for(all_held.wait(), 10)
    # One more read queues for a connection: the pool is exhausted.
    queued = asyncio.create_task(store.read(lambda conn: conn.execute(select(1)).scalar()))
    await asyncio.sleep(0.2)
    assert not queued.done()
    try:
        records, lost = await asyncio.wait_for(
            store.append([NewEvent(thread_id, None, "test.event", TS, "{}")]), 10
        )
        result, committed = await asyncio.wait_for(
            store.commit([NewEvent(thread_id, None, "test.atomic", TS, "{}")], lambda conn: 7),
            10,
        )
        assert [r.seq for r in records] == [1] and not lost
        assert result == 7 and [r.seq for r in committed] == [2]
        assert not queued.done() and not any(reader.done() for reader in readers)
    finally:
        release.set()
        await asyncio.gather(*readers, queued)
