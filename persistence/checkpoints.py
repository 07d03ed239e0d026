"""Checkpoints: serialized SDK RunStates, versioned per run.

A checkpoint is written in the same transaction as the run's new status (and, for a pause, the
approvals it raises and their events), guarded by the run's current checkpoint version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

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


def _row(checkpoint: CheckpointRecord) -> dict[str, object]:
    return {
        "run_id": checkpoint.run_id,
        "version": checkpoint.version,
        "state": checkpoint.state,
        "sdk_schema_version": checkpoint.sdk_schema_version,
        "graph_name": checkpoint.graph_name,
        "graph_version": checkpoint.graph_version,
        "reason": checkpoint.reason,
        "session_mark": checkpoint.session_mark,
        "created_at": checkpoint.created_at,
    }


class CheckpointRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @staticmethod
    async def save_in(
        conn: AsyncConnection,
        checkpoint: CheckpointRecord,
        *,
        status: RunStatus,
        expected: Sequence[RunStatus],
    ) -> None:
        """Store `checkpoint` as the run's next version and move the run's status, atomically.

        Raises `StaleWrite` if the run is no longer at `checkpoint.version - 1` in one of
        `expected` (cancelled, or another writer moved it on); nothing is stored then, so an
        older snapshot can never overwrite a newer one.
        """
        moved = await conn.execute(
            update(runs)
            .where(
                runs.c.run_id == checkpoint.run_id,
                runs.c.checkpoint_version == checkpoint.version - 1,
                runs.c.status.in_([s.value for s in expected]),
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
        await conn.execute(checkpoints.insert().values(**_row(checkpoint)))

    @staticmethod
    async def add_final_in(conn: AsyncConnection, checkpoint: CheckpointRecord) -> None:
        """Store the state a run ended with, in the transaction that ends the run.

        The run's status is set by that transaction; this only advances the version, under
        the same rule as `save_in`: never over a newer checkpoint.
        """
        moved = await conn.execute(
            update(runs)
            .where(
                runs.c.run_id == checkpoint.run_id,
                runs.c.checkpoint_version == checkpoint.version - 1,
            )
            .values(checkpoint_version=checkpoint.version)
        )
        if moved.rowcount != 1:
            raise StaleWrite(
                f"run {checkpoint.run_id} is not at checkpoint {checkpoint.version - 1}"
            )
        await conn.execute(checkpoints.insert().values(**_row(checkpoint)))

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
