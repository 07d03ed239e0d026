"""The SDK session's message table, seen from the gateway.

Runs remember the newest session message id when they start (and each checkpoint remembers it
when taken). A run restarted after a crash trims the session back to that mark, so history
written by the lost attempt is not duplicated by the new one.
"""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, String, Table, delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from persistence.db import transaction

# A read/write view of the SDK's `agent_messages` table (created by migration 0001).
_messages = Table(
    "agent_messages",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("session_id", String),
)


class SessionMarks:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def head(self, session_id: str) -> int:
        async with transaction(self._engine) as conn:
            value = (
                await conn.execute(
                    select(func.max(_messages.c.id)).where(_messages.c.session_id == session_id)
                )
            ).scalar()
        return int(value or 0)

    async def trim(self, session_id: str, mark: int) -> int:
        async with transaction(self._engine) as conn:
            result = await conn.execute(
                delete(_messages).where(_messages.c.session_id == session_id, _messages.c.id > mark)
            )
        return int(result.rowcount or 0)
