"""Runs: one application-level turn and its lifecycle status."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import as_utc, transaction, utcnow
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

    @classmethod
    def from_row(cls, row: RowMapping) -> RunRecord:
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
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @staticmethod
    async def insert(conn: AsyncConnection, record: RunRecord) -> None:
        await conn.execute(
            runs.insert().values(
                run_id=record.run_id,
                thread_id=record.thread_id,
                tenant=record.tenant,
                owner=record.owner,
                status=record.status.value,
                agent=record.agent,
                graph_version=record.graph_version,
                on_disconnect=record.on_disconnect,
                input=record.input,
                checkpoint_version=record.checkpoint_version,
                session_mark=record.session_mark,
                error=record.error,
                created_at=record.created_at,
                updated_at=record.updated_at,
                requested_by=record.requested_by,
            )
        )

    async def get(self, run_id: str) -> RunRecord | None:
        async with transaction(self._engine) as conn:
            return await self.get_in(conn, run_id)

    @staticmethod
    async def get_in(conn: AsyncConnection, run_id: str) -> RunRecord | None:
        row = (await conn.execute(select(runs).where(runs.c.run_id == run_id))).mappings().first()
        return RunRecord.from_row(row) if row else None

    async def active_for_thread(self, thread_id: str) -> RunRecord | None:
        query = select(runs).where(
            runs.c.thread_id == thread_id, runs.c.status.in_([s.value for s in ACTIVE])
        )
        async with transaction(self._engine) as conn:
            row = (await conn.execute(query)).mappings().first()
        return RunRecord.from_row(row) if row else None

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
