"""The per-thread event log table.

`seq` is assigned inside the writing transaction by bumping `threads.head_seq`, so the sequence
stays dense and unique even if more than one process ever writes to the same database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import transaction
from persistence.leases import Lease
from persistence.tables import events, threads


@dataclass(frozen=True)
class NewEvent:
    thread_id: str
    run_id: str | None
    type: str
    ts: str
    data: str  # compact JSON text
    # The run lease the writer held when producing the event; stored only if still current.
    lease: Lease | None = None


@dataclass(frozen=True)
class EventRecord:
    thread_id: str
    seq: int
    run_id: str | None
    type: str
    ts: str
    data: str


class ThreadMissing(LookupError):
    pass


class EventRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def append_batch(self, batch: Sequence[NewEvent]) -> list[EventRecord]:
        """Store a batch in one transaction; returns the records with their seq, in order."""
        async with transaction(self._engine) as conn:
            return await self.append_in(conn, batch)

    @staticmethod
    async def append_in(conn: AsyncConnection, batch: Sequence[NewEvent]) -> list[EventRecord]:
        counts: dict[str, int] = {}
        for item in batch:
            counts[item.thread_id] = counts.get(item.thread_id, 0) + 1
        next_seq: dict[str, int] = {}
        for thread_id, count in counts.items():
            head = (
                await conn.execute(
                    update(threads)
                    .where(threads.c.thread_id == thread_id)
                    .values(head_seq=threads.c.head_seq + count)
                    .returning(threads.c.head_seq)
                )
            ).scalar_one_or_none()
            if head is None:
                raise ThreadMissing(thread_id)
            next_seq[thread_id] = int(head) - count + 1
        records: list[EventRecord] = []
        for item in batch:
            seq = next_seq[item.thread_id]
            next_seq[item.thread_id] = seq + 1
            records.append(
                EventRecord(item.thread_id, seq, item.run_id, item.type, item.ts, item.data)
            )
        await conn.execute(
            events.insert(),
            [
                {
                    "thread_id": r.thread_id,
                    "seq": r.seq,
                    "run_id": r.run_id,
                    "type": r.type,
                    "ts": r.ts,
                    "data": r.data,
                }
                for r in records
            ],
        )
        return records

    async def read(self, thread_id: str, *, after_seq: int, limit: int) -> list[EventRecord]:
        query = (
            select(
                events.c.thread_id,
                events.c.seq,
                events.c.run_id,
                events.c.type,
                events.c.ts,
                events.c.data,
            )
            .where(events.c.thread_id == thread_id, events.c.seq > after_seq)
            .order_by(events.c.seq)
            .limit(limit)
        )
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).all()
        return [EventRecord(*row) for row in rows]

    async def for_run(self, run_id: str, types: Sequence[str]) -> list[EventRecord]:
        query = (
            select(
                events.c.thread_id,
                events.c.seq,
                events.c.run_id,
                events.c.type,
                events.c.ts,
                events.c.data,
            )
            .where(events.c.run_id == run_id, events.c.type.in_(list(types)))
            .order_by(events.c.seq)
        )
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).all()
        return [EventRecord(*row) for row in rows]
