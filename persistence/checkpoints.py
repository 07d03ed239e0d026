"""Checkpoints: serialized SDK RunStates, versioned per run.

A checkpoint is written in the same transaction as the run's new status (and, for a pause, the
approvals it raises and their events), guarded by the run's current checkpoint version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import as_utc, transaction, utcnow
from persistence.direct import Direct, placeholders
from persistence.errors import StaleWrite
from persistence.events import SqliteEventStore, direct_store
from persistence.runs import RunStatus
from persistence.sessions import SessionMarks
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
    def from_row(cls, row: RowMapping | dict[str, Any]) -> CheckpointRecord:
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
    def __init__(self, engine: AsyncEngine, store: SqliteEventStore | None = None) -> None:
        self._engine = engine
        self._store = store

    @staticmethod
    async def save_in(
        conn: AsyncConnection,
        checkpoint: CheckpointRecord,
        *,
        status: RunStatus,
        expected: Sequence[RunStatus],
        session_of: str | None = None,
    ) -> CheckpointRecord:
        """Store `checkpoint` as the run's next version and move the run's status, atomically;
        returns what was stored.

        Raises `StaleWrite` if the run is no longer at `checkpoint.version - 1` in one of
        `expected` (cancelled, or another writer moved it on); nothing is stored then, so an
        older snapshot can never overwrite a newer one.

        With `session_of` (the run's thread), the stored `session_mark` is that session's head
        read in this transaction: right for a state taken after the stream ended, when nothing
        writes to the session any more, and one round trip fewer than reading it before.
        """
        if session_of is not None:
            mark = await SessionMarks.head_in(conn, session_of)
            checkpoint = replace(checkpoint, session_mark=mark)
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
        return checkpoint

    @staticmethod
    def save_direct(
        db: Direct,
        checkpoint: CheckpointRecord,
        *,
        status: RunStatus,
        expected: Sequence[RunStatus],
        session_of: str | None = None,
    ) -> CheckpointRecord:
        """`save_in` on the direct path: the same statements and guarantees."""
        if session_of is not None:
            checkpoint = replace(checkpoint, session_mark=SessionMarks.head_direct(db, session_of))
        statuses = [s.value for s in expected]
        moved = db.changed(
            "UPDATE runs SET checkpoint_version = ?, status = ?, updated_at = ?"
            " WHERE run_id = ? AND checkpoint_version = ?"
            f" AND status IN ({placeholders(len(statuses))})",
            (
                checkpoint.version,
                status.value,
                db.value(runs.c.updated_at, utcnow()),
                checkpoint.run_id,
                checkpoint.version - 1,
                *statuses,
            ),
        )
        if moved != 1:
            raise StaleWrite(
                f"run {checkpoint.run_id} is not at checkpoint {checkpoint.version - 1}"
            )
        db.insert(checkpoints, [_row(checkpoint)])
        return checkpoint

    @staticmethod
    async def add_final_in(
        conn: AsyncConnection, checkpoint: CheckpointRecord, *, session_of: str | None = None
    ) -> CheckpointRecord:
        """Store the state a run ended with, in the transaction that ends the run.

        The run's status is set by that transaction; this only advances the version, under
        the same rule as `save_in`: never over a newer checkpoint. `session_of` as in `save_in`.
        """
        if session_of is not None:
            mark = await SessionMarks.head_in(conn, session_of)
            checkpoint = replace(checkpoint, session_mark=mark)
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
        return checkpoint

    @staticmethod
    def add_final_direct(
        db: Direct, checkpoint: CheckpointRecord, *, session_of: str | None = None
    ) -> CheckpointRecord:
        """`add_final_in` on the direct path."""
        if session_of is not None:
            checkpoint = replace(checkpoint, session_mark=SessionMarks.head_direct(db, session_of))
        moved = db.changed(
            "UPDATE runs SET checkpoint_version = ? WHERE run_id = ? AND checkpoint_version = ?",
            (checkpoint.version, checkpoint.run_id, checkpoint.version - 1),
        )
        if moved != 1:
            raise StaleWrite(
                f"run {checkpoint.run_id} is not at checkpoint {checkpoint.version - 1}"
            )
        db.insert(checkpoints, [_row(checkpoint)])
        return checkpoint

    async def latest(self, run_id: str) -> CheckpointRecord | None:
        if (store := direct_store(self._store)) is not None:
            return await store.query(lambda db: self.latest_direct(db, run_id))
        query = (
            select(checkpoints)
            .where(checkpoints.c.run_id == run_id)
            .order_by(checkpoints.c.version.desc())
            .limit(1)
        )
        async with transaction(self._engine) as conn:
            row = (await conn.execute(query)).mappings().first()
        return CheckpointRecord.from_row(row) if row else None

    @staticmethod
    def latest_direct(db: Direct, run_id: str) -> CheckpointRecord | None:
        rows = db.select(checkpoints, "run_id = ?", (run_id,), "ORDER BY version DESC LIMIT 1")
        return CheckpointRecord.from_row(rows[0]) if rows else None
