"""Pending inputs: text a user sent while a run was paused (staged) or busy (queued)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import transaction, utcnow
from persistence.direct import Direct, placeholders
from persistence.events import SqliteEventStore, direct_store
from persistence.tables import pending_inputs


class Disposition(StrEnum):
    STAGED = "staged"
    QUEUED = "queued"


@dataclass(frozen=True)
class PendingInput:
    input_id: int
    thread_id: str
    run_id: str | None
    input: str
    disposition: Disposition
    sender: str | None = None


class InputRepository:
    def __init__(self, engine: AsyncEngine, store: SqliteEventStore | None = None) -> None:
        self._engine = engine
        self._store = store

    @staticmethod
    async def insert_in(
        conn: AsyncConnection,
        *,
        thread_id: str,
        run_id: str | None,
        text: str,
        disposition: Disposition,
        sender: str | None = None,
    ) -> None:
        await conn.execute(
            pending_inputs.insert().values(
                thread_id=thread_id,
                run_id=run_id,
                input=text,
                disposition=disposition.value,
                sender=sender,
                created_at=utcnow(),
            )
        )

    @staticmethod
    async def consume_in(
        conn: AsyncConnection, input_ids: list[int], *, run_id: str | None = None
    ) -> None:
        """Mark inputs as admitted (a queued input also records the run it started)."""
        if not input_ids:
            return
        values: dict[str, object] = {"consumed_at": utcnow()}
        if run_id is not None:
            values["run_id"] = run_id
        await conn.execute(
            update(pending_inputs).where(pending_inputs.c.input_id.in_(input_ids)).values(**values)
        )

    @staticmethod
    def consume_direct(db: Direct, input_ids: list[int], *, run_id: str | None = None) -> None:
        """`consume_in` on the direct path."""
        if not input_ids:
            return
        assignments = ["consumed_at = ?"]
        values: list[object] = [db.value(pending_inputs.c.consumed_at, utcnow())]
        if run_id is not None:
            assignments.append("run_id = ?")
            values.append(run_id)
        db.execute(
            f"UPDATE pending_inputs SET {', '.join(assignments)}"
            f" WHERE input_id IN ({placeholders(len(input_ids))})",
            (*values, *input_ids),
        )

    async def count_open(self, *, thread_id: str, run_id: str) -> int:
        """Inputs still waiting on a thread: all queued ones, and those staged on `run_id`.

        Staged inputs of other (ended) runs are never admitted, so they do not count.
        """
        query = (
            select(func.count())
            .select_from(pending_inputs)
            .where(
                pending_inputs.c.thread_id == thread_id,
                pending_inputs.c.consumed_at.is_(None),
                or_(
                    pending_inputs.c.disposition == Disposition.QUEUED.value,
                    and_(
                        pending_inputs.c.disposition == Disposition.STAGED.value,
                        pending_inputs.c.run_id == run_id,
                    ),
                ),
            )
        )
        async with transaction(self._engine) as conn:
            return int((await conn.execute(query)).scalar_one())

    async def open(
        self, *, thread_id: str, disposition: Disposition, run_id: str | None = None
    ) -> list[PendingInput]:
        if (store := direct_store(self._store)) is not None:
            return await store.query(
                lambda db: self.open_direct(
                    db, thread_id=thread_id, disposition=disposition, run_id=run_id
                )
            )
        async with transaction(self._engine) as conn:
            return await self.open_in(
                conn, thread_id=thread_id, disposition=disposition, run_id=run_id
            )

    @staticmethod
    async def open_in(
        conn: AsyncConnection,
        *,
        thread_id: str,
        disposition: Disposition,
        run_id: str | None = None,
    ) -> list[PendingInput]:
        query = select(pending_inputs).where(
            pending_inputs.c.thread_id == thread_id,
            pending_inputs.c.disposition == disposition.value,
            pending_inputs.c.consumed_at.is_(None),
        )
        if run_id is not None:
            query = query.where(pending_inputs.c.run_id == run_id)
        rows = (await conn.execute(query.order_by(pending_inputs.c.input_id))).mappings()
        return [
            PendingInput(
                input_id=row["input_id"],
                thread_id=row["thread_id"],
                run_id=row["run_id"],
                input=row["input"],
                disposition=Disposition(row["disposition"]),
                sender=row["sender"],
            )
            for row in rows
        ]

    @staticmethod
    def open_direct(
        db: Direct, *, thread_id: str, disposition: Disposition, run_id: str | None = None
    ) -> list[PendingInput]:
        where = "thread_id = ? AND disposition = ? AND consumed_at IS NULL"
        params: list[object] = [thread_id, disposition.value]
        if run_id is not None:
            where += " AND run_id = ?"
            params.append(run_id)
        return [
            PendingInput(
                input_id=row["input_id"],
                thread_id=row["thread_id"],
                run_id=row["run_id"],
                input=row["input"],
                disposition=Disposition(row["disposition"]),
                sender=row["sender"],
            )
            for row in db.select(pending_inputs, where, params, "ORDER BY input_id")
        ]
