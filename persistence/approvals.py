"""Approvals: pending tool calls awaiting a human decision, decided at most once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Select, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import as_utc, transaction, utcnow
from persistence.direct import Direct, placeholders
from persistence.events import SqliteEventStore, direct_store
from persistence.tables import approvals


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"
    EXPIRED = "expired"


@dataclass(frozen=True)
class ApprovalRecord:
    approval_id: str
    run_id: str
    thread_id: str
    tenant: str
    checkpoint_version: int
    call_id: str
    tool_name: str
    agent: str
    arguments: Any
    arguments_digest: str
    status: ApprovalStatus
    reviewer: str | None
    reason: str | None
    requested_at: datetime
    decided_at: datetime | None
    # Past this instant the system rejects the approval (GATEWAY_APPROVAL_TTL_S); None: never.
    expires_at: datetime | None = None

    def values(self) -> dict[str, Any]:
        """The row to insert for a new approval."""
        return {
            "approval_id": self.approval_id,
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "tenant": self.tenant,
            "checkpoint_version": self.checkpoint_version,
            "call_id": self.call_id,
            "tool_name": self.tool_name,
            "agent": self.agent,
            "arguments": self.arguments,
            "arguments_digest": self.arguments_digest,
            "status": self.status.value,
            "reviewer": self.reviewer,
            "reason": self.reason,
            "requested_at": self.requested_at,
            "decided_at": self.decided_at,
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_row(cls, row: RowMapping | dict[str, Any]) -> ApprovalRecord:
        return cls(
            approval_id=row["approval_id"],
            run_id=row["run_id"],
            thread_id=row["thread_id"],
            tenant=row["tenant"],
            checkpoint_version=int(row["checkpoint_version"]),
            call_id=row["call_id"],
            tool_name=row["tool_name"],
            agent=row["agent"],
            arguments=row["arguments"],
            arguments_digest=row["arguments_digest"],
            status=ApprovalStatus(row["status"]),
            reviewer=row["reviewer"],
            reason=row["reason"],
            requested_at=as_utc(row["requested_at"]) or utcnow(),
            decided_at=as_utc(row["decided_at"]),
            expires_at=as_utc(row.get("expires_at")),
        )


class ApprovalRepository:
    def __init__(self, engine: AsyncEngine, store: SqliteEventStore | None = None) -> None:
        self._engine = engine
        self._store = store

    @staticmethod
    async def insert_in(conn: AsyncConnection, records: Sequence[ApprovalRecord]) -> None:
        await conn.execute(approvals.insert(), [r.values() for r in records])

    @staticmethod
    def insert_direct(db: Direct, records: Sequence[ApprovalRecord]) -> None:
        db.insert(approvals, [r.values() for r in records])

    async def get(self, approval_id: str) -> ApprovalRecord | None:
        if (store := direct_store(self._store)) is not None:
            return await store.query(lambda db: self.get_direct(db, approval_id))
        query = select(approvals).where(approvals.c.approval_id == approval_id)
        async with transaction(self._engine) as conn:
            row = (await conn.execute(query)).mappings().first()
        return ApprovalRecord.from_row(row) if row else None

    async def _records(self, query: Select[Any]) -> list[ApprovalRecord]:
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [ApprovalRecord.from_row(row) for row in rows]

    @staticmethod
    def get_direct(db: Direct, approval_id: str) -> ApprovalRecord | None:
        rows = db.select(approvals, "approval_id = ?", (approval_id,))
        return ApprovalRecord.from_row(rows[0]) if rows else None

    async def for_checkpoint(self, run_id: str, checkpoint_version: int) -> list[ApprovalRecord]:
        if (store := direct_store(self._store)) is not None:
            return await store.query(
                lambda db: self.for_checkpoint_direct(db, run_id, checkpoint_version)
            )
        async with transaction(self._engine) as conn:
            return await self.for_checkpoint_in(conn, run_id, checkpoint_version)

    @staticmethod
    async def for_checkpoint_in(
        conn: AsyncConnection, run_id: str, checkpoint_version: int
    ) -> list[ApprovalRecord]:
        query = (
            select(approvals)
            .where(
                approvals.c.run_id == run_id,
                approvals.c.checkpoint_version == checkpoint_version,
            )
            .order_by(approvals.c.requested_at, approvals.c.approval_id)
        )
        rows = (await conn.execute(query)).mappings().all()
        return [ApprovalRecord.from_row(row) for row in rows]

    @staticmethod
    def for_checkpoint_direct(
        db: Direct, run_id: str, checkpoint_version: int
    ) -> list[ApprovalRecord]:
        rows = db.select(
            approvals,
            "run_id = ? AND checkpoint_version = ?",
            (run_id, checkpoint_version),
            "ORDER BY requested_at, approval_id",
        )
        return [ApprovalRecord.from_row(row) for row in rows]

    async def pending_for_tenant(self, tenant: str, limit: int = 500) -> list[ApprovalRecord]:
        query = (
            select(approvals)
            .where(
                approvals.c.tenant == tenant,
                approvals.c.status == ApprovalStatus.PENDING.value,
            )
            .order_by(approvals.c.requested_at)
            .limit(limit)
        )
        return await self._records(query)

    @staticmethod
    async def decide_in(
        conn: AsyncConnection,
        approval_id: str,
        *,
        status: ApprovalStatus,
        reviewer: str,
        reason: str | None,
        checkpoint_version: int,
        decided_at: datetime,
    ) -> bool:
        """Record a decision if the approval is still pending at that checkpoint version.

        False when someone else decided first or the run moved on: decided at most once.
        """
        return await ApprovalRepository._settle_pending_in(
            conn,
            approval_id,
            checkpoint_version,
            status=status.value,
            reviewer=reviewer,
            reason=reason,
            decided_at=decided_at,
        )

    @staticmethod
    def decide_direct(
        db: Direct,
        approval_id: str,
        *,
        status: ApprovalStatus,
        reviewer: str,
        reason: str | None,
        checkpoint_version: int,
        decided_at: datetime,
    ) -> bool:
        """`decide_in` on the direct path: the same compare-and-swap."""
        changed = db.changed(
            "UPDATE approvals SET status = ?, reviewer = ?, reason = ?, decided_at = ?"
            " WHERE approval_id = ? AND status = ? AND checkpoint_version = ?",
            (
                status.value,
                reviewer,
                reason,
                db.value(approvals.c.decided_at, decided_at),
                approval_id,
                ApprovalStatus.PENDING.value,
                checkpoint_version,
            ),
        )
        return changed == 1

    async def expired_pending(self, now: datetime, limit: int = 200) -> list[ApprovalRecord]:
        """Pending approvals whose `expires_at` has passed, oldest first."""
        query = (
            select(approvals)
            .where(
                approvals.c.status == ApprovalStatus.PENDING.value,
                approvals.c.expires_at.is_not(None),
                approvals.c.expires_at <= now,
            )
            .order_by(approvals.c.expires_at)
            .limit(limit)
        )
        return await self._records(query)

    @staticmethod
    async def expire_in(
        conn: AsyncConnection,
        approval_id: str,
        *,
        reason: str,
        checkpoint_version: int,
        decided_at: datetime,
    ) -> bool:
        """Reject a pending approval on behalf of the system (no reviewer); at most once."""
        return await ApprovalRepository._settle_pending_in(
            conn,
            approval_id,
            checkpoint_version,
            status=ApprovalStatus.EXPIRED.value,
            reviewer=None,
            reason=reason,
            decided_at=decided_at,
        )

    @staticmethod
    async def _settle_pending_in(
        conn: AsyncConnection, approval_id: str, checkpoint_version: int, **values: Any
    ) -> bool:
        """Write `values` only while the approval is pending at that checkpoint version, so
        a reviewer, a concurrent reviewer and the expiry sweep settle it once between them."""
        result = await conn.execute(
            update(approvals)
            .where(
                approvals.c.approval_id == approval_id,
                approvals.c.status == ApprovalStatus.PENDING.value,
                approvals.c.checkpoint_version == checkpoint_version,
            )
            .values(**values)
        )
        return result.rowcount == 1

    @staticmethod
    async def supersede_in(
        conn: AsyncConnection, approval_ids: Sequence[str], *, reason: str
    ) -> list[str]:
        """Mark these approvals superseded unless already superseded or expired; returns the
        ids that changed. Also used for approved rows that turned out not to bind to their
        call, so the record never claims an approval that was not applied."""
        if not approval_ids:
            return []
        open_statuses = (
            ApprovalStatus.PENDING.value,
            ApprovalStatus.APPROVED.value,
            ApprovalStatus.REJECTED.value,
        )
        ids = list(
            (
                await conn.execute(
                    select(approvals.c.approval_id).where(
                        approvals.c.approval_id.in_(list(approval_ids)),
                        approvals.c.status.in_(open_statuses),
                    )
                )
            ).scalars()
        )
        if ids:
            await conn.execute(
                update(approvals)
                .where(approvals.c.approval_id.in_(ids))
                .values(
                    status=ApprovalStatus.SUPERSEDED.value,
                    reason=reason,
                    decided_at=utcnow(),
                )
            )
        return ids

    @staticmethod
    async def supersede_pending_in(conn: AsyncConnection, run_id: str) -> list[str]:
        """Mark every pending approval of the run superseded; returns their ids."""
        ids = list(
            (
                await conn.execute(
                    select(approvals.c.approval_id).where(
                        approvals.c.run_id == run_id,
                        approvals.c.status == ApprovalStatus.PENDING.value,
                    )
                )
            ).scalars()
        )
        if ids:
            await conn.execute(
                update(approvals)
                .where(approvals.c.approval_id.in_(ids))
                .values(status=ApprovalStatus.SUPERSEDED.value, decided_at=utcnow())
            )
        return ids

    @staticmethod
    def supersede_direct(db: Direct, approval_ids: Sequence[str], *, reason: str) -> list[str]:
        """`supersede_in` on the direct path."""
        if not approval_ids:
            return []
        open_statuses = (
            ApprovalStatus.PENDING.value,
            ApprovalStatus.APPROVED.value,
            ApprovalStatus.REJECTED.value,
        )
        ids = db.scalars(
            f"SELECT approval_id FROM approvals WHERE approval_id IN "
            f"({placeholders(len(approval_ids))}) AND status IN ({placeholders(3)})",
            (*approval_ids, *open_statuses),
        )
        if ids:
            db.execute(
                "UPDATE approvals SET status = ?, reason = ?, decided_at = ?"
                f" WHERE approval_id IN ({placeholders(len(ids))})",
                (
                    ApprovalStatus.SUPERSEDED.value,
                    reason,
                    db.value(approvals.c.decided_at, utcnow()),
                    *ids,
                ),
            )
        return ids

    @staticmethod
    def supersede_pending_direct(db: Direct, run_id: str) -> list[str]:
        """`supersede_pending_in` on the direct path."""
        ids = db.scalars(
            "SELECT approval_id FROM approvals WHERE run_id = ? AND status = ?",
            (run_id, ApprovalStatus.PENDING.value),
        )
        if ids:
            db.execute(
                "UPDATE approvals SET status = ?, decided_at = ?"
                f" WHERE approval_id IN ({placeholders(len(ids))})",
                (
                    ApprovalStatus.SUPERSEDED.value,
                    db.value(approvals.c.decided_at, utcnow()),
                    *ids,
                ),
            )
        return ids
