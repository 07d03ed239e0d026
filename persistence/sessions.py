"""The SDK session's tables, seen from the gateway.

Runs remember the newest session message id when they start (and each checkpoint remembers it
when taken). A run restarted after a crash trims the session back to that mark, so history
written by the lost attempt is not duplicated by the new one.

`GatewaySession` is the SDK's `SQLAlchemySession` on the same tables, with its two operations
of every run (read the history at the start, append each turn's items) through the Store: the
SDK does each through an ORM session, five to seven statements and several milliseconds, in
the middle of the run (the append before a pause is on the way from a tool call to its
`approval.requested`).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from agents.extensions.memory import SQLAlchemySession
from agents.items import TResponseInputItem
from agents.memory.session_settings import resolve_session_limit
from sqlalchemy import (
    String,
    Text,
    bindparam,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from persistence.prepared import Prepared
from persistence.sqlite.connect import pin_busy_timeout

if TYPE_CHECKING:
    from persistence.store import Store

T = TypeVar("T")


class GatewaySession(SQLAlchemySession):
    """`SQLAlchemySession` whose history read and appends go through the gateway's Store.

    The same rows as the SDK writes them: items serialized by the SDK's own `_serialize_item`,
    the session row created on first use, `created_at` and `updated_at` left to the tables'
    `CURRENT_TIMESTAMP`, history read in `created_at, id` order (the newest `limit` items, a
    corrupted row skipped, as the SDK reads them). Appends are one write transaction of the
    store (on SQLite in turn with the event log's commits rather than competing with them for
    the write lock; on PostgreSQL one statement), reads one read. Everything else
    (`pop_item`, `clear_session`) is the SDK's own code on the store's async engine.
    """

    def __init__(self, session_id: str, *, store: Store) -> None:
        super().__init__(session_id, engine=store.engine)
        # The SDK added a connect listener of its own to the engine (a shorter busy timeout).
        pin_busy_timeout(store.engine)
        self._store = store
        # Known to hold nothing yet (`for_session`): the history is not read until the first
        # append.
        self._empty = False
        # Built once here and shared by every copy (`for_session`): they describe the same
        # tables for every session.
        messages, sessions = self._messages, self._sessions
        of_session = messages.c.session_id == bindparam("b_session")
        self._oldest_first = Prepared(
            select(messages.c.message_data)
            .where(of_session)
            .order_by(messages.c.created_at.asc(), messages.c.id.asc())
        )
        self._latest_first = Prepared(
            select(messages.c.message_data)
            .where(of_session)
            .order_by(messages.c.created_at.desc(), messages.c.id.desc())
            .limit(bindparam("b_limit"))
        )
        self._insert_messages = Prepared(insert(messages), keys=["session_id", "message_data"])
        self._touch = Prepared(
            update(sessions)
            .where(sessions.c.session_id == bindparam("b_session"))
            .values(updated_at=text("CURRENT_TIMESTAMP"))
        )
        self._insert_session = Prepared(insert(sessions), keys=["session_id"])
        # PostgreSQL: the whole append in one statement (`single_statement`), one round trip
        # instead of four (BEGIN, the touch, the rows, COMMIT). The session's row is made or
        # touched by the CTE; the items are inserted in their order, so their ids (the order
        # the history is read in, after `created_at`, one timestamp per statement) follow it.
        touched = (
            postgresql.insert(sessions)
            .values(session_id=bindparam("b_session"))
            .on_conflict_do_update(
                index_elements=[sessions.c.session_id],
                set_={"updated_at": text("CURRENT_TIMESTAMP")},
            )
            .cte("touched")
        )
        items = (
            func.unnest(bindparam("b_items", type_=postgresql.ARRAY(Text)))
            .table_valued("message_data", with_ordinality="n")
            .render_derived()
        )
        self._append_in_one = (
            Prepared(
                insert(messages)
                .from_select(
                    ["session_id", "message_data"],
                    select(bindparam("b_session", type_=String), items.c.message_data).order_by(
                        items.c.n
                    ),
                )
                .add_cte(touched)
            )
            if store.backend == "postgresql"
            else None
        )

    def for_session(self, session_id: str, *, empty: bool = False) -> GatewaySession:
        """This session's twin for another session id, sharing everything else. `empty`:
        the session is known to hold nothing (its thread was created by the run about to use
        it), so its history is not read until something is appended.

        The SDK's constructor builds SQLAlchemy `Table` objects for its two tables each time
        (~0.6 ms, a tenth of the gateway's own cost of a short run); they describe the same
        tables for every session, so each run copies one session built at start-up. Nothing
        that is copied changes after construction: table definitions, statements, the engine,
        the session factory, settings, and the per-engine lock the SDK shares between sessions
        anyway.
        """
        twin = copy.copy(self)
        twin.session_id = session_id
        twin._empty = empty
        return twin

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        if self._empty:
            return []
        session_limit = resolve_session_limit(limit, self.session_settings)
        if session_limit is None:
            return await self._decode(await self._rows(self._oldest_first))
        if session_limit <= 0:
            # The SDK passes such a limit to the database as it is; so does this.
            rows = await self._rows(self._latest_first, session_limit)
            return await self._decode(rows[::-1])
        # The newest `session_limit` readable items: the window grows past corrupted rows.
        window = session_limit
        while True:
            rows = await self._rows(self._latest_first, window)
            items = await self._decode(rows[::-1])
            if len(items) >= session_limit:
                return items[-session_limit:]
            if len(rows) < window:
                return items
            window *= 2

    async def _rows(self, query: Prepared, limit: int | None = None) -> list[str]:
        params: dict[str, Any] = {"b_session": self.session_id}
        if limit is not None:
            params["b_limit"] = limit
        return await self._store.read(lambda conn: [row[0] for row in query.rows(conn, params)])

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
        self._empty = False
        payload = [await self._serialize_item(item) for item in items]
        if self._append_in_one is not None:
            params = {"b_session": self.session_id, "b_items": payload}
            append = partial(self._append_in_one.rowcount, params=params)
            await _settled(self._store.write(append, single_statement=True))
            return
        await _settled(self._store.write(partial(self._append, payload)))

    def _append(self, payload: list[str], conn: Connection) -> None:
        if self._touch.rowcount(conn, {"b_session": self.session_id}) == 0:
            # The session's first items: its row (one run writes a thread's session at a time).
            self._insert_session.rowcount(conn, {"session_id": self.session_id})
        self._insert_messages.many(
            conn, [{"session_id": self.session_id, "message_data": data} for data in payload]
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
