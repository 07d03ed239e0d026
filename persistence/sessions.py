"""The SDK session's tables, seen from the gateway.

Runs remember the newest session message id when they start (and each checkpoint remembers it
when taken). A run restarted after a crash trims the session back to that mark, so history
written by the lost attempt is not duplicated by the new one.

`GatewaySession` is the SDK's `SQLAlchemySession` on the same tables, with its two operations
of every run (read the history at the start, append each turn's items) on the direct SQLite
path: the SDK does each through an ORM session, five to seven statements and several
milliseconds, in the middle of the run (the append before a pause is on the way from a tool
call to its `approval.requested`).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable
from functools import partial
from typing import Any, TypeVar

from agents.extensions.memory import SQLAlchemySession
from agents.items import TResponseInputItem
from agents.memory.session_settings import resolve_session_limit
from sqlalchemy import Column, Integer, MetaData, String, Table, delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import transaction
from persistence.direct import Direct
from persistence.events import SqliteEventStore, direct_store

T = TypeVar("T")

# A read/write view of the SDK's `agent_messages` table (created by migration 0001).
_messages = Table(
    "agent_messages",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("session_id", String),
)


class SessionMarks:
    def __init__(self, engine: AsyncEngine, store: SqliteEventStore | None = None) -> None:
        self._engine = engine
        self._store = store

    async def head(self, session_id: str) -> int:
        if (store := direct_store(self._store)) is not None:
            return await store.query(lambda db: self.head_direct(db, session_id))
        async with transaction(self._engine) as conn:
            return await self.head_in(conn, session_id)

    @staticmethod
    async def head_in(conn: AsyncConnection, session_id: str) -> int:
        """The session's newest message id, inside the caller's transaction (0: none)."""
        value = (
            await conn.execute(
                select(func.max(_messages.c.id)).where(_messages.c.session_id == session_id)
            )
        ).scalar()
        return int(value or 0)

    @staticmethod
    def head_direct(db: Direct, session_id: str) -> int:
        value = db.scalars(
            "SELECT MAX(id) FROM agent_messages WHERE session_id = ?", (session_id,)
        )[0]
        return int(value or 0)

    async def trim(self, session_id: str, mark: int) -> int:
        async with transaction(self._engine) as conn:
            return await self.trim_in(conn, session_id, mark)

    @staticmethod
    async def trim_in(conn: AsyncConnection, session_id: str, mark: int) -> int:
        """Remove the session's messages after `mark`, inside the caller's transaction."""
        result = await conn.execute(
            delete(_messages).where(_messages.c.session_id == session_id, _messages.c.id > mark)
        )
        return int(result.rowcount or 0)

    @staticmethod
    def trim_direct(db: Direct, session_id: str, mark: int) -> int:
        return db.changed(
            "DELETE FROM agent_messages WHERE session_id = ? AND id > ?", (session_id, mark)
        )


class GatewaySession(SQLAlchemySession):
    """`SQLAlchemySession` whose history read and appends take the direct SQLite path.

    The same rows as the SDK writes them: items serialized by the SDK's own `_serialize_item`,
    the session row created on first use, `created_at` and `updated_at` left to the tables'
    `CURRENT_TIMESTAMP`, history read in `created_at, id` order (the newest `limit` items, a
    corrupted row skipped, as the SDK reads them). Appends run on the event log's writer
    connection (one transaction, one hop, in turn with the log's commits rather than competing
    with them for SQLite's lock), reads on the direct path's reader. Everything else
    (`pop_item`, `clear_session`, and every call while the direct path is unavailable) is the
    SDK's own code.
    """

    def __init__(
        self, session_id: str, *, engine: AsyncEngine, store: SqliteEventStore | None
    ) -> None:
        super().__init__(session_id, engine=engine)
        self._store = store

    def for_session(self, session_id: str) -> GatewaySession:
        """This session's twin for another session id, sharing everything else.

        The SDK's constructor builds SQLAlchemy `Table` objects for its two tables each time
        (~0.6 ms, a tenth of the gateway's own cost of a short run); they describe the same
        tables for every session, so each run copies one session built at start-up. Nothing
        that is copied changes after construction: table definitions, the engine, the session
        factory, settings, and the per-engine lock the SDK shares between sessions anyway.
        """
        twin = copy.copy(self)
        twin.session_id = session_id
        return twin

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        store = direct_store(self._store)
        if store is None:
            return await super().get_items(limit)
        session_limit = resolve_session_limit(limit, self.session_settings)
        select = f"SELECT message_data FROM {self._messages.name} WHERE session_id = ?"
        if session_limit is None:
            sql = f"{select} ORDER BY created_at ASC, id ASC"
            return await self._decode(await self._rows(store, sql, (self.session_id,)))
        latest_first = f"{select} ORDER BY created_at DESC, id DESC LIMIT ?"
        if session_limit <= 0:
            # The SDK passes such a limit to the database as it is; so does this.
            rows = await self._rows(store, latest_first, (self.session_id, session_limit))
            return await self._decode(rows[::-1])
        # The newest `session_limit` readable items: the window grows past corrupted rows.
        window = session_limit
        while True:
            rows = await self._rows(store, latest_first, (self.session_id, window))
            items = await self._decode(rows[::-1])
            if len(items) >= session_limit:
                return items[-session_limit:]
            if len(rows) < window:
                return items
            window *= 2

    @staticmethod
    async def _rows(store: SqliteEventStore, sql: str, params: tuple[Any, ...]) -> list[str]:
        return await store.query(lambda db: db.scalars(sql, params))

    async def _decode(self, rows: list[str]) -> list[TResponseInputItem]:
        items: list[TResponseInputItem] = []
        for raw in rows:
            try:
                items.append(await self._deserialize_item(raw))
            except json.JSONDecodeError:
                continue  # a corrupted row is skipped, as the SDK does
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        store = direct_store(self._store)
        if store is None:
            await super().add_items(items)
            return
        payload = [await self._serialize_item(item) for item in items]
        await _settled(store.commit((), partial(self._append, payload)))

    def _append(self, payload: list[str], db: Direct) -> None:
        sessions, messages = self._sessions.name, self._messages.name
        db.execute(
            f"INSERT INTO {sessions} (session_id) VALUES (?) ON CONFLICT (session_id) DO NOTHING",
            (self.session_id,),
        )
        db.conn.executemany(
            f"INSERT INTO {messages} (session_id, message_data) VALUES (?, ?)",
            [(self.session_id, data) for data in payload],
        )
        db.execute(
            f"UPDATE {sessions} SET updated_at = CURRENT_TIMESTAMP WHERE session_id = ?",
            (self.session_id,),
        )


async def _settled(write: Awaitable[T]) -> T:
    """Wait for a write's outcome even when the caller is cancelled meanwhile (as the SDK's own
    session writes do): a run that stops must know what its session holds."""
    task = asyncio.ensure_future(write)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        raise cancelled
    return task.result()
