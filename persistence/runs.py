"""Runs: one application-level turn and its lifecycle status."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import as_utc, transaction, utcnow
from persistence.direct import Direct, placeholders
from persistence.events import SqliteEventStore, direct_store
from persistence.tables import approvals, runs


class RunStatus(StrEnum):
    RUNNING = "running"
    WAITING_FOR_REVIEW = "waiting_for_review"
    RESUMING = "resuming"
    SUSPENDED = "suspended"
    RECOVERING = "recovering"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
ACTIVE = frozenset(RunStatus) - TERMINAL


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    thread_id: str
    tenant: str
    owner: str
    status: RunStatus
    agent: str
    graph_version: str
    on_disconnect: str
    input: str
    checkpoint_version: int
    session_mark: int
    error: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    # Who started the run, or sent the input that started it (the four-eyes "requester");
    # None for runs created before it was recorded.
    requested_by: str | None = None

    def values(self) -> dict[str, Any]:
        """The row to insert for a new run."""
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "tenant": self.tenant,
            "owner": self.owner,
            "status": self.status.value,
            "agent": self.agent,
            "graph_version": self.graph_version,
            "on_disconnect": self.on_disconnect,
            "input": self.input,
            "checkpoint_version": self.checkpoint_version,
            "session_mark": self.session_mark,
            "error": self.error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "requested_by": self.requested_by,
        }

    @classmethod
    def from_row(cls, row: RowMapping | dict[str, Any]) -> RunRecord:
        return cls(
            run_id=row["run_id"],
            thread_id=row["thread_id"],
            tenant=row["tenant"],
            owner=row["owner"],
            status=RunStatus(row["status"]),
            agent=row["agent"],
            graph_version=row["graph_version"],
            on_disconnect=row["on_disconnect"],
            input=row["input"],
            checkpoint_version=int(row["checkpoint_version"]),
            session_mark=int(row["session_mark"]),
            error=row["error"],
            created_at=as_utc(row["created_at"]) or utcnow(),
            updated_at=as_utc(row["updated_at"]) or utcnow(),
            requested_by=row.get("requested_by"),
        )


class RunRepository:
    def __init__(self, engine: AsyncEngine, store: SqliteEventStore | None = None) -> None:
        self._engine = engine
        self._store = store

    @staticmethod
    async def insert(conn: AsyncConnection, record: RunRecord) -> None:
        await conn.execute(runs.insert().values(**record.values()))

    @staticmethod
    def insert_direct(db: Direct, record: RunRecord) -> None:
        db.insert(runs, [record.values()])

    async def get(self, run_id: str) -> RunRecord | None:
        if (store := direct_store(self._store)) is not None:
            return await store.query(lambda db: self.get_direct(db, run_id))
        async with transaction(self._engine) as conn:
            return await self.get_in(conn, run_id)

    @staticmethod
    def get_direct(db: Direct, run_id: str) -> RunRecord | None:
        rows = db.select(runs, "run_id = ?", (run_id,))
        return RunRecord.from_row(rows[0]) if rows else None

    @staticmethod
    async def get_in(conn: AsyncConnection, run_id: str) -> RunRecord | None:
        row = (await conn.execute(select(runs).where(runs.c.run_id == run_id))).mappings().first()
        return RunRecord.from_row(row) if row else None

    async def active_for_thread(self, thread_id: str) -> RunRecord | None:
        if (store := direct_store(self._store)) is not None:
            return await store.query(lambda db: self._active_direct(db, thread_id))
        query = select(runs).where(
            runs.c.thread_id == thread_id, runs.c.status.in_([s.value for s in ACTIVE])
        )
        async with transaction(self._engine) as conn:
            row = (await conn.execute(query)).mappings().first()
        return RunRecord.from_row(row) if row else None

    @staticmethod
    def _active_direct(db: Direct, thread_id: str) -> RunRecord | None:
        active = [s.value for s in ACTIVE]
        rows = db.select(
            runs, f"thread_id = ? AND status IN ({placeholders(len(active))})", (thread_id, *active)
        )
        return RunRecord.from_row(rows[0]) if rows else None

    async def with_status(self, statuses: Iterable[RunStatus]) -> list[RunRecord]:
        query = (
            select(runs)
            .where(runs.c.status.in_([s.value for s in statuses]))
            .order_by(runs.c.created_at)
        )
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [RunRecord.from_row(row) for row in rows]

    async def decided_but_waiting(self, limit: int = 500) -> list[RunRecord]:
        """Paused runs whose every approval is decided: their continuation did not start
        (it failed, or its process died in between) and must be retried."""
        pending = (
            select(approvals.c.approval_id)
            .where(
                approvals.c.run_id == runs.c.run_id,
                approvals.c.checkpoint_version == runs.c.checkpoint_version,
                approvals.c.status == "pending",
            )
            .exists()
        )
        query = (
            select(runs)
            .where(runs.c.status == RunStatus.WAITING_FOR_REVIEW.value, ~pending)
            .limit(limit)
        )
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [RunRecord.from_row(row) for row in rows]

    async def transition(
        self,
        run_id: str,
        to: RunStatus,
        *,
        expected: Iterable[RunStatus],
        checkpoint_version: int | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """Compare-and-swap the status; True when this caller won."""
        if (store := direct_store(self._store)) is not None:
            moved, _ = await store.commit(
                (),
                partial(
                    self.transition_direct,
                    run_id=run_id,
                    to=to,
                    expected=expected,
                    checkpoint_version=checkpoint_version,
                    error=error,
                ),
            )
            return bool(moved)
        async with transaction(self._engine) as conn:
            return await self.transition_in(
                conn,
                run_id,
                to,
                expected=expected,
                checkpoint_version=checkpoint_version,
                error=error,
            )

    @staticmethod
    async def transition_in(
        conn: AsyncConnection,
        run_id: str,
        to: RunStatus,
        *,
        expected: Iterable[RunStatus],
        checkpoint_version: int | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        query = update(runs).where(
            runs.c.run_id == run_id, runs.c.status.in_([s.value for s in expected])
        )
        if checkpoint_version is not None:
            query = query.where(runs.c.checkpoint_version == checkpoint_version)
        values: dict[str, Any] = {"status": to.value, "updated_at": utcnow()}
        if error is not None:
            values["error"] = error
        result = await conn.execute(query.values(**values))
        return result.rowcount == 1

    @staticmethod
    def transition_direct(
        db: Direct,
        run_id: str,
        to: RunStatus,
        *,
        expected: Iterable[RunStatus],
        checkpoint_version: int | None = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """`transition_in` on the direct path: the same compare-and-swap."""
        statuses = [s.value for s in expected]
        assignments = ["status = ?", "updated_at = ?"]
        values: list[Any] = [to.value, db.value(runs.c.updated_at, utcnow())]
        if error is not None:
            assignments.append("error = ?")
            values.append(db.value(runs.c.error, error))
        where = f"run_id = ? AND status IN ({placeholders(len(statuses))})"
        params: list[Any] = [run_id, *statuses]
        if checkpoint_version is not None:
            where += " AND checkpoint_version = ?"
            params.append(checkpoint_version)
        sql = f"UPDATE runs SET {', '.join(assignments)} WHERE {where}"
        return db.changed(sql, [*values, *params]) == 1
