"""Threads: one durable conversation with one event log."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import as_utc, transaction, utcnow
from persistence.direct import Direct
from persistence.events import SqliteEventStore, direct_store
from persistence.ids import new_id
from persistence.tables import threads

# Thread ids per `heads` call: within every backend's limit on bound parameters.
HEADS_PER_READ = 500


@dataclass(frozen=True)
class ThreadRecord:
    thread_id: str
    tenant: str
    owner: str
    created_at: datetime
    metadata: dict[str, Any]
    epoch: str
    head_seq: int
    truncated_seq: int = 0

    @classmethod
    def new(
        cls, *, tenant: str, owner: str, metadata: dict[str, Any] | None, thread_id: str | None
    ) -> ThreadRecord:
        return cls(
            thread_id=thread_id or new_id("t"),
            tenant=tenant,
            owner=owner,
            created_at=utcnow(),
            metadata=dict(metadata or {}),
            epoch=secrets.token_hex(4),
            head_seq=0,
        )

    def values(self) -> dict[str, Any]:
        """The row to insert for a new thread."""
        return {
            "thread_id": self.thread_id,
            "tenant": self.tenant,
            "owner": self.owner,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "epoch": self.epoch,
            "head_seq": 0,
        }

    @classmethod
    def from_row(cls, row: RowMapping | dict[str, Any]) -> ThreadRecord:
        return cls(
            thread_id=row["thread_id"],
            tenant=row["tenant"],
            owner=row["owner"],
            created_at=as_utc(row["created_at"]) or utcnow(),
            metadata=dict(row["metadata"] or {}),
            epoch=row["epoch"],
            head_seq=int(row["head_seq"]),
            truncated_seq=int(row["truncated_seq"] or 0),
        )


class ThreadRepository:
    def __init__(self, engine: AsyncEngine, store: SqliteEventStore | None = None) -> None:
        self._engine = engine
        self._store = store

    @staticmethod
    async def insert(
        conn: AsyncConnection,
        *,
        tenant: str,
        owner: str,
        metadata: dict[str, Any] | None,
        thread_id: str | None = None,
    ) -> ThreadRecord:
        record = ThreadRecord.new(
            tenant=tenant, owner=owner, metadata=metadata, thread_id=thread_id
        )
        await ThreadRepository.insert_record_in(conn, record)
        return record

    @staticmethod
    async def insert_record_in(conn: AsyncConnection, record: ThreadRecord) -> None:
        """Insert a thread made with `ThreadRecord.new`, inside the caller's transaction."""
        await conn.execute(threads.insert().values(**record.values()))

    @staticmethod
    def insert_direct(db: Direct, record: ThreadRecord) -> None:
        db.insert(threads, [record.values()])

    @staticmethod
    def get_direct(db: Direct, thread_id: str) -> ThreadRecord | None:
        rows = db.select(threads, "thread_id = ?", (thread_id,))
        return ThreadRecord.from_row(rows[0]) if rows else None

    async def heads(self, thread_ids: Sequence[str]) -> dict[str, int]:
        """`head_seq` of each of `thread_ids` that exists (at most `HEADS_PER_READ` ids)."""
        if (store := direct_store(self._store)) is not None:
            return await store.query(lambda db: self.heads_direct(db, thread_ids))
        async with transaction(self._engine) as conn:
            rows = await conn.execute(
                select(threads.c.thread_id, threads.c.head_seq).where(
                    threads.c.thread_id.in_(thread_ids)
                )
            )
            return {thread_id: int(head) for thread_id, head in rows.all()}

    @staticmethod
    def heads_direct(db: Direct, thread_ids: Sequence[str]) -> dict[str, int]:
        marks = ", ".join("?" for _ in thread_ids)
        rows = db.execute(
            f"SELECT thread_id, head_seq FROM threads WHERE thread_id IN ({marks})", thread_ids
        ).fetchall()
        return {thread_id: int(head) for thread_id, head in rows}

    async def create(
        self, *, tenant: str, owner: str, metadata: dict[str, Any] | None = None
    ) -> ThreadRecord:
        async with transaction(self._engine) as conn:
            return await self.insert(conn, tenant=tenant, owner=owner, metadata=metadata)

    async def get(self, thread_id: str) -> ThreadRecord | None:
        if (store := direct_store(self._store)) is not None:
            return await store.query(lambda db: self.get_direct(db, thread_id))
        async with transaction(self._engine) as conn:
            row = (
                (await conn.execute(select(threads).where(threads.c.thread_id == thread_id)))
                .mappings()
                .first()
            )
        return ThreadRecord.from_row(row) if row else None

    async def list_for(
        self, *, tenant: str, owner: str | None = None, limit: int = 100
    ) -> list[ThreadRecord]:
        query = select(threads).where(threads.c.tenant == tenant)
        if owner is not None:
            query = query.where(threads.c.owner == owner)
        query = query.order_by(threads.c.created_at.desc()).limit(limit)
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [ThreadRecord.from_row(row) for row in rows]
