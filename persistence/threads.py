"""Threads: one durable conversation with one event log."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.engine import Connection, RowMapping

from persistence.clock import as_utc, utcnow
from persistence.ids import new_id
from persistence.prepared import Prepared, PreparedIn
from persistence.session_marks import SessionMarks
from persistence.tables import checkpoints, events, pending_inputs, runs, threads

if TYPE_CHECKING:
    from persistence.store import Store

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
    title: str | None = None
    archived_at: datetime | None = None
    deleted_at: datetime | None = None

    @classmethod
    def new(
        cls,
        *,
        tenant: str,
        owner: str,
        metadata: dict[str, Any] | None,
        thread_id: str | None,
        title: str | None = None,
    ) -> ThreadRecord:
        return cls(
            thread_id=thread_id or new_id("t"),
            tenant=tenant,
            owner=owner,
            created_at=utcnow(),
            metadata=dict(metadata or {}),
            epoch=secrets.token_hex(4),
            head_seq=0,
            title=title,
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
            "truncated_seq": 0,
            "title": self.title,
            "archived_at": None,
            "deleted_at": None,
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
            title=row["title"],
            archived_at=as_utc(row["archived_at"]),
            deleted_at=as_utc(row["deleted_at"]),
        )


class ThreadRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    @staticmethod
    def insert_in(conn: Connection, record: ThreadRecord) -> None:
        """Insert a thread made with `ThreadRecord.new`, inside the caller's transaction."""
        _INSERT.rowcount(conn, record.values())

    async def create(
        self, *, tenant: str, owner: str, metadata: dict[str, Any] | None = None
    ) -> ThreadRecord:
        record = ThreadRecord.new(tenant=tenant, owner=owner, metadata=metadata, thread_id=None)
        await self._store.write(partial(self.insert_in, record=record))
        return record

    async def get(self, thread_id: str) -> ThreadRecord | None:
        return await self._store.read(partial(self.get_in, thread_id=thread_id))

    @staticmethod
    def get_in(conn: Connection, thread_id: str) -> ThreadRecord | None:
        row = _BY_ID.record(conn, {"b_thread": thread_id})
        return ThreadRecord.from_row(row) if row else None

    async def heads(self, thread_ids: Sequence[str]) -> dict[str, int]:
        """`head_seq` of each of `thread_ids` that exists (at most `HEADS_PER_READ` ids)."""

        if not thread_ids:
            return {}

        def read(conn: Connection) -> dict[str, int]:
            return {thread_id: int(head) for thread_id, head in _HEADS.rows(conn, thread_ids)}

        return await self._store.read(read)

    async def list_for(
        self,
        *,
        tenant: str | None,
        owner: str | None = None,
        limit: int = 100,
        archived: bool | None = False,
    ) -> list[ThreadRecord]:
        """The tenant's (or `owner`'s; every tenant's for None, the operator's command line)
        threads, newest first; deleted ones never. `archived`: only those not archived (False),
        only archived ones (True), or both (None)."""
        query = select(threads).where(threads.c.deleted_at.is_(None))
        if tenant is not None:
            query = query.where(threads.c.tenant == tenant)
        if owner is not None:
            query = query.where(threads.c.owner == owner)
        if archived is not None:
            query = query.where(
                threads.c.archived_at.is_not(None) if archived else threads.c.archived_at.is_(None)
            )
        query = query.order_by(threads.c.created_at.desc()).limit(limit)
        return await self._store.read(
            lambda conn: [ThreadRecord.from_row(row) for row in conn.execute(query).mappings()]
        )

    async def get_many(self, thread_ids: Sequence[str]) -> list[ThreadRecord]:
        """Those of `thread_ids` (at most `HEADS_PER_READ`) that exist, deleted ones included."""
        if not thread_ids:
            return []
        query = select(threads).where(threads.c.thread_id.in_(list(thread_ids)))
        return await self._store.read(
            lambda conn: [ThreadRecord.from_row(row) for row in conn.execute(query).mappings()]
        )

    @staticmethod
    def name_first_in(conn: Connection, thread_id: str, title: str) -> None:
        """Give an untitled thread `title` (its first input), inside the caller's transaction."""
        conn.execute(
            update(threads)
            .where(threads.c.thread_id == thread_id, threads.c.title.is_(None))
            .values(title=title)
        )

    @staticmethod
    def change_in(conn: Connection, thread_id: str, values: dict[str, Any]) -> bool:
        """Set `title` and/or `archived_at` of a thread that is not deleted, inside the caller's
        transaction; False when there is no such thread."""
        done = conn.execute(
            update(threads)
            .where(threads.c.thread_id == thread_id, threads.c.deleted_at.is_(None))
            .values(**values)
        )
        return bool(done.rowcount)

    @staticmethod
    def delete_in(conn: Connection, thread_id: str) -> bool:
        """Delete a thread inside the caller's transaction: its event log, checkpoints, waiting
        input and agent history go; its row stays, marked deleted and emptied, so the id is
        never reused and what retention keeps for good (runs, approvals with their decisions,
        the operation ledger, the audit trail) keeps pointing somewhere. False when the thread
        was deleted already."""
        done = conn.execute(
            update(threads)
            .where(threads.c.thread_id == thread_id, threads.c.deleted_at.is_(None))
            .values(deleted_at=utcnow(), title=None, metadata={})
        )
        if not done.rowcount:
            return False
        of_thread = select(runs.c.run_id).where(runs.c.thread_id == thread_id)
        conn.execute(delete(checkpoints).where(checkpoints.c.run_id.in_(of_thread)))
        conn.execute(delete(events).where(events.c.thread_id == thread_id))
        conn.execute(delete(pending_inputs).where(pending_inputs.c.thread_id == thread_id))
        SessionMarks.drop_in(conn, thread_id)
        return True


# A new thread's row: every field of the record (`ThreadRecord.values`).
_INSERT = Prepared(threads.insert(), keys=[field.name for field in fields(ThreadRecord)])
# A deleted thread is not found.
_BY_ID = Prepared(
    select(threads).where(
        threads.c.thread_id == bindparam("b_thread"), threads.c.deleted_at.is_(None)
    )
)
# Read every half second by the log watch for every watched thread: prepared, not an expanding
# IN list SQLAlchemy renders anew (hundreds of parameters) at each execution.
_HEADS = PreparedIn(
    "b_thread",
    lambda one_of: select(threads.c.thread_id, threads.c.head_seq).where(
        one_of.of(threads.c.thread_id)
    ),
)
