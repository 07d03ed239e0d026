"""`GatewaySession` (persistence/sessions.py) against the SDK's own `SQLAlchemySession` on the
same tables: what one writes the other reads back identically, with the SDK's ordering, limit
and corrupted-row rules; and every statement of the session's reads and appends goes through
the store's statement engines, where observers (SQL tracing, storage faults) see it."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from agents.extensions.memory import SQLAlchemySession
from agents.items import TResponseInputItem

from persistence.session_marks import SessionMarks
from persistence.sessions import GatewaySession
from persistence.store import Store
from tests.support.storage import migrated_store, observed


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[Store]:
    async with migrated_store(f"sqlite:///{db_path}") as store:
        yield store


def item(n: int) -> TResponseInputItem:
    return cast(TResponseInputItem, {"role": "user", "content": f'message {n} \u00e9 "quoted"'})


def stored(db_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db_path) as db:
        return db.execute(
            "SELECT session_id, message_data FROM agent_messages ORDER BY id"
        ).fetchall()


async def test_both_sessions_read_what_the_other_wrote(store: Store, db_path: Path) -> None:
    ours = GatewaySession("t_1", store=store)
    sdk = SQLAlchemySession("t_1", engine=store.engine)
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
    assert await SessionMarks(store).head("t_1") == len(rows)


async def test_limits_and_corrupted_rows_as_the_sdk_reads_them(store: Store, db_path: Path) -> None:
    ours = GatewaySession("t_2", store=store)
    sdk = SQLAlchemySession("t_2", engine=store.engine)
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


async def test_observers_see_every_statement_of_the_sessions_reads_and_appends(
    store: Store,
) -> None:
    ours = GatewaySession("t_3", store=store)
    await ours.add_items([item(1)])  # the session's row already exists from here on
    with observed(store) as statements:
        await ours.add_items([item(2)])
        assert any(s.startswith("UPDATE agent_sessions") for s in statements)
        assert any(s.startswith("INSERT INTO agent_messages") for s in statements)
        appended = len(statements)
        assert await ours.get_items() == [item(1), item(2)]
        assert any(s.startswith("SELECT") and "agent_messages" in s for s in statements[appended:])
    with observed(store) as first_use:
        await GatewaySession("t_4", store=store).add_items([item(3)])
    # A session's first append also creates its row.
    assert any(s.startswith("INSERT INTO agent_sessions") for s in first_use)
    assert any(s.startswith("INSERT INTO agent_messages") for s in first_use)


async def test_twins_of_one_session_keep_to_their_own_ids(store: Store, db_path: Path) -> None:
    """`for_session` copies share table definitions and statements only: each twin reads and
    writes its own session, with statements observed (SQL traced) or not."""
    template = GatewaySession("template", store=store)
    first, second = template.for_session("t_a"), template.for_session("t_b")
    assert (template.session_id, first.session_id, second.session_id) == ("template", "t_a", "t_b")
    assert first._messages is template._messages  # shared, not rebuilt
    await first.add_items([item(1)])
    await second.add_items([item(2)])
    with observed(store) as statements:
        await first.add_items([item(3)])
        assert await second.get_items() == [item(2)]
    assert any("agent_messages" in s for s in statements)
    assert await first.get_items() == [item(1), item(3)]
    assert await template.get_items() == []
    assert [sid for sid, _ in stored(db_path)] == ["t_a", "t_b", "t_a"]
    sdk = SQLAlchemySession("t_a", engine=store.engine)
    assert await sdk.get_items() == [item(1), item(3)]


async def test_a_session_known_empty_reads_nothing_until_its_first_append(store: Store) -> None:
    """A run that created its thread knows the thread's session holds nothing: its history is
    answered without a read until the run appends, and read as always from then on."""
    template = GatewaySession("template", store=store)
    fresh = template.for_session("t_new", empty=True)
    with observed(store) as statements:
        assert await fresh.get_items() == []
        assert await fresh.get_items(limit=3) == []
    assert statements == []
    await fresh.add_items([item(1)])
    with observed(store) as statements:
        assert await fresh.get_items() == [item(1)]
    assert statements
    # Twins made without it read, whatever they were copied from.
    assert await template.for_session("t_new").get_items() == [item(1)]
