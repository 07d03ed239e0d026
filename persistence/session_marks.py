"""Session marks: where a thread's agent history stood at a run's boundaries.

A run records the newest `agent_messages.id` of its thread when it starts (`session_mark`), so
a retry, a regeneration or a thread's deletion can cut the history back to it. Apart from
persistence/sessions.py (the SDK's session, which imports the Agents SDK): the operator's
command line and the repositories that trim or drop a history need only these statements.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from sqlalchemy import Column, Integer, MetaData, String, Table, bindparam, delete, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.elements import ColumnElement

from persistence.prepared import Prepared

if TYPE_CHECKING:
    from persistence.store import Store

# A read/write view of the SDK's `agent_messages` table (created by migration 0001).
_messages = Table(
    "agent_messages",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("session_id", String),
)


class SessionMarks:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def head(self, session_id: str) -> int:
        return await self._store.read(partial(self.head_in, session_id=session_id))

    @staticmethod
    def head_in(conn: Connection, session_id: str) -> int:
        """The session's newest message id, inside the caller's transaction (0: none)."""
        rows = _HEAD.rows(conn, {"b_session": session_id})
        return int(rows[0][0] or 0) if rows else 0

    async def trim(self, session_id: str, mark: int) -> int:
        return await self._store.write(partial(self.trim_in, session_id=session_id, mark=mark))

    @staticmethod
    def head_of(session_id: ColumnElement[str]) -> ColumnElement[int]:
        """The session's newest message id, as an expression for a statement of its own
        (null: none)."""
        return (
            select(func.max(_messages.c.id))
            .where(_messages.c.session_id == session_id)
            .scalar_subquery()
        )

    @staticmethod
    def trim_of(
        session_id: ColumnElement[str], mark: ColumnElement[int]
    ) -> ReturningDelete[tuple[int]]:
        """`trim_in` as an expression, for a statement that trims as it does something else
        (each removed message's id returned)."""
        return (
            delete(_messages)
            .where(_messages.c.session_id == session_id, _messages.c.id > mark)
            .returning(_messages.c.id)
        )

    @staticmethod
    def trim_in(conn: Connection, session_id: str, mark: int) -> int:
        """Remove the session's messages after `mark`, inside the caller's transaction."""
        return _TRIM.rowcount(conn, {"b_session": session_id, "b_mark": mark})

    @staticmethod
    def drop_in(conn: Connection, session_id: str) -> int:
        """Remove every message of the session (its thread was deleted)."""
        return _TRIM.rowcount(conn, {"b_session": session_id, "b_mark": 0})


_HEAD = Prepared(
    select(func.max(_messages.c.id)).where(_messages.c.session_id == bindparam("b_session"))
)
_TRIM = Prepared(
    delete(_messages).where(
        _messages.c.session_id == bindparam("b_session"), _messages.c.id > bindparam("b_mark")
    )
)
