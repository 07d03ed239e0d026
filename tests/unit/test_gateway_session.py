"""`GatewaySession` (persistence/sessions.py) against the SDK's own `SQLAlchemySession` on the
same tables: what one writes the other reads back identically, with the SDK's ordering, limit
and corrupted-row rules; and the SDK's code runs whenever the direct path is not in use."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from agents.extensions.memory import SQLAlchemySession
from agents.items import TResponseInputItem
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from persistence.events import SqliteEventStore
from persistence.sessions import GatewaySession, SessionMarks
from tests.support.storage import migrated_engine


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
async def engine(db_path: Path) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(db_path) as engine:
        yield engine


@pytest.fixture
async def store(engine: AsyncEngine) -> AsyncIterator[SqliteEventStore]:
    store = SqliteEventStore.for_engine(engine)
    assert store is not None
    try:
        yield store
    finally:
        await store.close()


def item(n: int) -> TResponseInputItem:
    return cast(TResponseInputItem, {"role": "user", "content": f'message {n} \u00e9 "quoted"'})


def stored(db_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db_path) as db:
        return db.execute(
            "SELECT session_id, message_data FROM agent_messages ORDER BY id"
        ).fetchall()


async def test_both_sessions_read_what_the_other_wrote(
    engine: AsyncEngine, store: SqliteEventStore, db_path: Path
) -> None:
    ours = GatewaySession("t_1", engine=engine, store=store)
    sdk = SQLAlchemySession("t_1", engine=engine)
    await ours.add_items([item(1), item(2)])
    await sdk.add_items([item(3)])
    await ours.add_items([item(4)])
    expected = [item(n) for n in (1, 2, 3, 4)]
    assert await ours.get_items() == await sdk.get_items() == expected
    # The same stored text as the SDK's: its serializer, one row per item, one session row.
    rows = stored(db_path)
    assert rows == [("t_1", await sdk._serialize_item(i)) for i in expected]
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT session_id FROM agent_sessions").fetchall() == [("t_1",)]
    assert await SessionMarks(engine, store).head("t_1") == len(rows)


async def test_limits_and_corrupted_rows_as_the_sdk_reads_them(
    engine: AsyncEngine, store: SqliteEventStore, db_path: Path
) -> None:
    ours = GatewaySession("t_2", engine=engine, store=store)
    sdk = SQLAlchemySession("t_2", engine=engine)
    await ours.add_items([item(n) for n in range(1, 6)])
    with sqlite3.connect(db_path) as db:
        db.execute(
            "INSERT INTO agent_messages (session_id, message_data) VALUES ('t_2', '{broken')"
        )
    await ours.add_items([item(6)])
    for limit in (None, 1, 2, 3, 6, 10):
        assert await ours.get_items(limit) == await sdk.get_items(limit), limit
    assert await ours.get_items(2) == [item(5), item(6)]
    assert await ours.get_items() == [item(n) for n in range(1, 7)]


async def test_observed_statements_keep_the_sdk_code(
    engine: AsyncEngine, store: SqliteEventStore
) -> None:
    statements: list[str] = []

    def observe(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    ours = GatewaySession("t_3", engine=engine, store=store)
    await ours.add_items([item(1)])
    assert statements == []
    event.listen(engine.sync_engine, "before_cursor_execute", observe)
    try:
        await ours.add_items([item(2)])
        assert await ours.get_items() == [item(1), item(2)]
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", observe)
    assert any("agent_messages" in s for s in statements)


async def test_twins_of_one_session_keep_to_their_own_ids_on_both_paths(
    engine: AsyncEngine, store: SqliteEventStore, db_path: Path
) -> None:
    """`for_session` copies share table definitions only: each twin reads and writes its own
    session, on the direct path and through the SDK's own code alike (SQL traced)."""
    template = GatewaySession("template", engine=engine, store=store)
    first, second = template.for_session("t_a"), template.for_session("t_b")
    assert (template.session_id, first.session_id, second.session_id) == ("template", "t_a", "t_b")
    assert first._messages is template._messages  # shared, not rebuilt
    await first.add_items([item(1)])
    await second.add_items([item(2)])

    def observe(*_args: Any) -> None:
        pass

    event.listen(engine.sync_engine, "before_cursor_execute", observe)  # the SDK's code path
    try:
        await first.add_items([item(3)])
        assert await second.get_items() == [item(2)]
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", observe)
    assert await first.get_items() == [item(1), item(3)]
    assert await template.get_items() == []
    assert [sid for sid, _ in stored(db_path)] == ["t_a", "t_b", "t_a"]
    sdk = SQLAlchemySession("t_a", engine=engine)
    assert await sdk.get_items() == [item(1), item(3)]
