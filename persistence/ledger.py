"""The operation ledger table: one row per side-effecting tool call, keyed by (scope, call_id)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.exc import IntegrityError

from persistence.clock import utcnow
from persistence.prepared import Prepared
from persistence.tables import operations

if TYPE_CHECKING:
    from persistence.store import Store, Work


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
    def __init__(self, store: Store) -> None:
        self._store = store

    async def begin(self, scope: str, call_id: str, tool_name: str) -> OperationRecord | None:
        """Record that the call is starting. Returns None if this is the first attempt,
        else the existing record (the call was attempted before)."""

        try:
            started = {
                "scope": scope,
                "call_id": call_id,
                "tool_name": tool_name,
                "status": OperationStatus.STARTED.value,
                "started_at": utcnow(),
            }
            await self._store.write(
                lambda conn: _BEGIN.rowcount(conn, started), single_statement=True
            )
            return None
        except IntegrityError:
            pass  # attempted before: the row says how far it got
        key = {"b_scope": scope, "b_call": call_id}
        row = await self._store.read(lambda conn: _BY_KEY.records(conn, key)[0])
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
        await self._store.write(outcome_in(scope, call_id, status, result), single_statement=True)

    async def count(
        self, tool_name: str | None = None, status: OperationStatus | None = None
    ) -> int:
        query = select(func.count()).select_from(operations)
        if tool_name is not None:
            query = query.where(operations.c.tool_name == tool_name)
        if status is not None:
            query = query.where(operations.c.status == status.value)
        return await self._store.read(lambda conn: int(conn.execute(query).scalar_one()))


def outcome_in(scope: str, call_id: str, status: OperationStatus, result: str | None) -> Work[int]:
    """The call's outcome (`done`, `failed` or `reconcile`, with its text) as one statement of a
    writing transaction: on its own (`finish`), or queued on the event log's writer."""
    params = {
        "b_scope": scope,
        "b_call": call_id,
        "b_status": status.value,
        "b_result": result,
        "b_now": utcnow(),
    }
    return lambda conn: _FINISH.rowcount(conn, params)


_BEGIN = Prepared(
    operations.insert(), keys=["scope", "call_id", "tool_name", "status", "started_at"]
)
_OF_CALL = (operations.c.scope == bindparam("b_scope"), operations.c.call_id == bindparam("b_call"))
_BY_KEY = Prepared(select(operations).where(*_OF_CALL))
_FINISH = Prepared(
    update(operations)
    .where(*_OF_CALL)
    .values(
        status=bindparam("b_status"), result=bindparam("b_result"), finished_at=bindparam("b_now")
    )
)
