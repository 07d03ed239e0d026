"""Stores for tests below the gateway: a migrated database, an event log on it, a leased run.

`database_url` (tests/conftest.py) names a test's database on either backend: a SQLite file in
the test's folder, or a PostgreSQL database of its own (tests/support/postgres.py), created and
dropped by the test.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import event, text, update

from gateway.event_log.bus import EventBus
from gateway.event_log.writer import EventLog
from persistence.backends import open_store
from persistence.clock import utcnow
from persistence.run_status import RunStatus
from persistence.runs import RunRecord, RunRepository
from persistence.schema import migrate
from persistence.store import Store
from persistence.tables import runs


@asynccontextmanager
async def migrated_store(url: str) -> AsyncIterator[Store]:
    store = open_store(url)
    await migrate(store)
    try:
        yield store
    finally:
        await store.close()


def seq_of(frame: str) -> int:
    """The `seq` of an event frame as a subscription sends it."""
    return int(frame.split('"seq":', 1)[1].split(",", 1)[0])


@asynccontextmanager
async def running_event_log(
    store: Store, bus: EventBus | None = None, *, merge_s: float = 0.0
) -> AsyncIterator[EventLog]:
    log = EventLog(store, bus or EventBus(), merge_s=merge_s)
    await log.start()
    try:
        yield log
    finally:
        await log.close()


@contextmanager
def observed(store: Store) -> Iterator[list[str]]:
    """Every statement the store runs while inside, as SQL tracing or storage faults see it."""
    statements: list[str] = []

    def observe(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    engines = list(store.statement_engines())
    for engine in engines:
        event.listen(engine, "before_cursor_execute", observe)
    try:
        yield statements
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", observe)


def running_run(run_id: str, thread_id: str) -> RunRecord:
    """A `running` run of alice's on `thread_id`."""
    now = utcnow()
    return RunRecord(
        run_id=run_id,
        thread_id=thread_id,
        tenant="acme",
        owner="alice",
        status=RunStatus.RUNNING,
        agent="assistant",
        graph_version="1",
        on_disconnect="continue",
        input="hi",
        checkpoint_version=0,
        session_mark=0,
        error=None,
        created_at=now,
        updated_at=now,
    )


async def insert_running_run(store: Store, run_id: str, thread_id: str) -> None:
    """A `running` run row on `thread_id`, with no lease yet."""
    await store.write(lambda conn: RunRepository.insert_in(conn, running_run(run_id, thread_id)))


async def expire_lease(store: Store, run_id: str) -> None:
    """The run's lease ran out a second ago (its holder stopped renewing)."""
    await store.write(
        lambda conn: conn.execute(
            update(runs)
            .where(runs.c.run_id == run_id)
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
    )


async def rows(database_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read a gateway's database through a store of the test's own, beside the gateway's (whose
    statements a test's faults may be failing). `?` marks the parameters, in order."""
    numbers = iter(range(len(params)))
    sql = re.sub(r"\?", lambda _: f":p{next(numbers)}", query)
    bound = {f"p{i}": value for i, value in enumerate(params)}
    store = open_store(database_url)
    try:
        return await store.read(lambda conn: [tuple(r) for r in conn.execute(text(sql), bound)])
    finally:
        await store.close()
