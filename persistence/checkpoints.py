"""Checkpoints: serialized SDK RunStates, versioned per run.

A checkpoint is written together with the approvals it raises and the run's new status in one
transaction, guarded by the run's current checkpoint version, so an older snapshot can never
overwrite a newer one and approvals never exist without their state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from persistence.approvals import ApprovalRecord, ApprovalRepository
from persistence.db import as_utc, transaction, utcnow
from persistence.errors import StaleWrite
from persistence.runs import RunStatus
from persistence.tables import checkpoints, runs


@dataclass(frozen=True)
class CheckpointRecord:
    run_id: str
    version: int
    state: str
    sdk_schema_version: str
    graph_name: str
    graph_version: str
    reason: str
    session_mark: int
    created_at: datetime

    @classmethod
    def from_row(cls, row: RowMapping) -> CheckpointRecord:
        return cls(
            run_id=row["run_id"],
            version=int(row["version"]),
            state=row["state"],
            sdk_schema_version=row["sdk_schema_version"],
            graph_name=row["graph_name"],
            graph_version=row["graph_version"],
            reason=row["reason"],
            session_mark=int(row["session_mark"]),
            created_at=as_utc(row["created_at"]) or utcnow(),
        )


class CheckpointRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def save(
        self,
        checkpoint: CheckpointRecord,
        *,
        status: RunStatus,
        expected_status: Sequence[RunStatus],
        approvals: Sequence[ApprovalRecord] = (),
    ) -> None:
        """Store `checkpoint` as the run's next version, with its approvals and new status.

        Raises `StaleWrite` if the run is no longer at `checkpoint.version - 1` in one of
        `expected_status` (another writer moved it on); nothing is stored then.
        """
        async with transaction(self._engine) as conn:
            moved = await conn.execute(
                update(runs)
                .where(
                    runs.c.run_id == checkpoint.run_id,
                    runs.c.checkpoint_version == checkpoint.version - 1,
                    runs.c.status.in_([s.value for s in expected_status]),
                )
                .values(
                    checkpoint_version=checkpoint.version,
                    status=status.value,
                    updated_at=utcnow(),
                )
            )
            if moved.rowcount != 1:
                raise StaleWrite(
                    f"run {checkpoint.run_id} is not at checkpoint {checkpoint.version - 1}"
                )
            await conn.execute(
                checkpoints.insert().values(
                    run_id=checkpoint.run_id,
                    version=checkpoint.version,
                    state=checkpoint.state,
                    sdk_schema_version=checkpoint.sdk_schema_version,
                    graph_name=checkpoint.graph_name,
                    graph_version=checkpoint.graph_version,
                    reason=checkpoint.reason,
                    session_mark=checkpoint.session_mark,
                    created_at=checkpoint.created_at,
                )
            )
            if approvals:
                await ApprovalRepository.insert_in(conn, approvals)

    async def latest(self, run_id: str) -> CheckpointRecord | None:
        query = (
            select(checkpoints)
            .where(checkpoints.c.run_id == run_id)
            .order_by(checkpoints.c.version.desc())
            .limit(1)
        )
        async with transaction(self._engine) as conn:
            row = (await conn.execute(query)).mappings().first()
        return CheckpointRecord.from_row(row) if row else None
