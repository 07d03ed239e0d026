"""The operation ledger table: one row per side-effecting tool call, keyed by (scope, call_id)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from persistence.db import transaction, utcnow
from persistence.tables import operations


class OperationStatus(StrEnum):
    STARTED = "started"
    DONE = "done"
    FAILED = "failed"
    # Found "started" after a crash and not re-run: a human must check the external system.
    NEEDS_RECONCILIATION = "reconcile"


@dataclass(frozen=True)
class OperationRecord:
    scope: str
    call_id: str
    tool_name: str
    status: OperationStatus
    result: str | None


class OperationRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def begin(self, scope: str, call_id: str, tool_name: str) -> OperationRecord | None:
        """Record that the call is starting. Returns None if this is the first attempt,
        else the existing record (the call was attempted before)."""
        try:
            async with transaction(self._engine) as conn:
                await conn.execute(
                    operations.insert().values(
                        scope=scope,
                        call_id=call_id,
                        tool_name=tool_name,
                        status=OperationStatus.STARTED.value,
                        started_at=utcnow(),
                    )
                )
            return None
        except IntegrityError:
            pass
        async with transaction(self._engine) as conn:
            row = (
                (
                    await conn.execute(
                        select(operations).where(
                            operations.c.scope == scope, operations.c.call_id == call_id
                        )
                    )
                )
                .mappings()
                .one()
            )
        return OperationRecord(
            scope=row["scope"],
            call_id=row["call_id"],
            tool_name=row["tool_name"],
            status=OperationStatus(row["status"]),
            result=row["result"],
        )

    async def finish(
        self, scope: str, call_id: str, status: OperationStatus, result: str | None
    ) -> None:
        async with transaction(self._engine) as conn:
            await conn.execute(
                update(operations)
                .where(operations.c.scope == scope, operations.c.call_id == call_id)
                .values(status=status.value, result=result, finished_at=utcnow())
            )

    async def count(
        self, tool_name: str | None = None, status: OperationStatus | None = None
    ) -> int:
        query = select(operations.c.call_id)
        if tool_name is not None:
            query = query.where(operations.c.tool_name == tool_name)
        if status is not None:
            query = query.where(operations.c.status == status.value)
        async with transaction(self._engine) as conn:
            return len((await conn.execute(query)).all())
