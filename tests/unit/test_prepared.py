"""`Prepared` (persistence/prepared.py): the hottest statements on SQLite's own cursor.

Prepared only where SQLite takes and gives values as they are and the SQL does not depend on
them; there it returns what SQLAlchemy's execution returns, its statements reach the engine's
observers, and driver errors arrive as SQLAlchemy's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, event, insert, select, update
from sqlalchemy.exc import IntegrityError

from persistence.clock import utcnow
from persistence.prepared import Prepared
from persistence.store import Store
from persistence.tables import events, runs, threads
from persistence.threads import ThreadRepository
from tests.support.storage import migrated_store

BY_THREAD = (
    select(events.c.seq, events.c.data)
    .where(events.c.thread_id == bindparam("b_thread"))
    .order_by(events.c.seq)
)
INSERT = insert(events)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with migrated_store(f"sqlite:///{tmp_path / 'prepared.db'}") as store:
        yield store


def test_only_statements_that_need_no_conversion_are_prepared() -> None:
    assert Prepared(BY_THREAD)._sqlite is not None
    keys = ["thread_id", "seq", "run_id", "type", "ts", "data"]
    assert Prepared(INSERT, keys=keys)._sqlite is not None
    # A datetime is stored as text by SQLAlchemy's SQLite type: a bind processor.
    touch = update(runs).where(runs.c.run_id == bindparam("b")).values(updated_at=utcnow())
    assert Prepared(touch)._sqlite is None
    # JSON is decoded on the way out: a result processor.
    assert Prepared(select(threads.c.metadata))._sqlite is None
    # An expanding IN list changes the SQL with the values.
    many = select(events.c.seq).where(events.c.thread_id.in_(bindparam("b", expanding=True)))
    assert Prepared(many)._sqlite is None


async def test_prepared_and_sqlalchemy_execution_agree(store: Store) -> None:
    thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
    keys = ["thread_id", "seq", "run_id", "type", "ts", "data"]
    prepared_insert, prepared_read = Prepared(INSERT, keys=keys), Prepared(BY_THREAD)
    rows = [
        {
            "thread_id": thread.thread_id,
            "seq": n,
            "run_id": None,
            "type": "t",
            "ts": "x",
            "data": f'{{"n":{n}}}',
        }
        for n in range(1, 4)
    ]
    seen: list[str] = []

    def observe(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement.split()[0])

    (engine,) = store.statement_engines()
    event.listen(engine, "before_cursor_execute", observe)
    try:
        await store.write(lambda conn: prepared_insert.many(conn, rows))
        params = {"b_thread": thread.thread_id}
        via_prepared = await store.read(lambda conn: prepared_read.rows(conn, params))
    finally:
        event.remove(engine, "before_cursor_execute", observe)
    via_sqlalchemy = await store.read(
        lambda conn: [tuple(row) for row in conn.execute(BY_THREAD, params)]
    )
    assert via_prepared == via_sqlalchemy == [(n, f'{{"n":{n}}}') for n in range(1, 4)]
    # (A lane's first use also sets up its connection: PRAGMA statements.)
    assert [kind for kind in seen if kind != "PRAGMA"] == ["BEGIN", "INSERT", "COMMIT", "SELECT"]
    # A driver error arrives as SQLAlchemy's, and the transaction is rolled back whole.
    with pytest.raises(IntegrityError):
        await store.write(lambda conn: prepared_insert.many(conn, [*rows[:1], *rows[:1]]))
    assert await store.read(lambda conn: prepared_read.rows(conn, params)) == via_prepared
    with pytest.raises(KeyError):
        await store.read(lambda conn: prepared_read.rows(conn, {}))
