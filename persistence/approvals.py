"""Approvals: pending tool calls awaiting a human decision, decided at most once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import as_utc, transaction, utcnow
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

    @classmethod
    def from_row(cls, row: RowMapping) -> ApprovalRecord:
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
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @staticmethod
    async def insert_in(conn: AsyncConnection, records: Sequence[ApprovalRecord]) -> None:
        await conn.execute(
            approvals.insert(),
            [
                {
                    "approval_id": r.approval_id,
                    "run_id": r.run_id,
                    "thread_id": r.thread_id,
                    "tenant": r.tenant,
                    "checkpoint_version": r.checkpoint_version,
                    "call_id": r.call_id,
                    "tool_name": r.tool_name,
                    "agent": r.agent,
                    "arguments": r.arguments,
                    "arguments_digest": r.arguments_digest,
                    "status": r.status.value,
                    "reviewer": r.reviewer,
                    "reason": r.reason,
                    "requested_at": r.requested_at,
                    "decided_at": r.decided_at,
                    "expires_at": r.expires_at,
                }
                for r in records
            ],
        )

    async def get(self, approval_id: str) -> ApprovalRecord | None:
        query = select(approvals).where(approvals.c.approval_id == approval_id)
        async with transaction(self._engine) as conn:
            row = (await conn.execute(query)).mappings().first()
        return ApprovalRecord.from_row(row) if row else None

    async def for_checkpoint(self, run_id: str, checkpoint_version: int) -> list[ApprovalRecord]:
        query = (
            select(approvals)
            .where(
                approvals.c.run_id == run_id,
                approvals.c.checkpoint_version == checkpoint_version,
            )
            .order_by(approvals.c.requested_at, approvals.c.approval_id)
        )
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
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
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [ApprovalRecord.from_row(row) for row in rows]

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
        result = await conn.execute(
            update(approvals)
            .where(
                approvals.c.approval_id == approval_id,
                approvals.c.status == ApprovalStatus.PENDING.value,
                approvals.c.checkpoint_version == checkpoint_version,
            )
            .values(status=status.value, reviewer=reviewer, reason=reason, decided_at=decided_at)
        )
        return result.rowcount == 1

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
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [ApprovalRecord.from_row(row) for row in rows]

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
        result = await conn.execute(
            update(approvals)
            .where(
                approvals.c.approval_id == approval_id,
                approvals.c.status == ApprovalStatus.PENDING.value,
                approvals.c.checkpoint_version == checkpoint_version,
            )
            .values(
                status=ApprovalStatus.EXPIRED.value,
                reviewer=None,
                reason=reason,
                decided_at=decided_at,
            )
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
