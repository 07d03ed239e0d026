"""Approvals: pending tool calls awaiting a human decision, decided at most once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import JSON, Label, Select, Table, and_, bindparam, func, or_, select, update
from sqlalchemy.engine import Connection, RowMapping

from persistence.audit import AuditEntry, AuditRepository
from persistence.clock import as_utc, utcnow
from persistence.inputs import Disposition, InputRepository
from persistence.prepared import Prepared
from persistence.runs import RunRecord
from persistence.tables import approvals, runs, threads
from persistence.threads import ThreadRecord

if TYPE_CHECKING:
    from persistence.store import Store


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"
    EXPIRED = "expired"

    @classmethod
    def of_verdict(cls, verdict: str) -> ApprovalStatus:
        """What a decision (`"approve"` or `"reject"`) makes of an approval."""
        return cls.APPROVED if verdict == "approve" else cls.REJECTED


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
    # The arguments a reviewer approved the call with instead of `arguments` (None: as made).
    edited_arguments: dict[str, Any] | None = None

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
            "edited_arguments": self.edited_arguments,
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
            edited_arguments=row.get("edited_arguments"),
        )


class PauseApprovals(NamedTuple):
    """A pause's approvals as one read found them (`ApprovalRepository.of_pause_in`)."""

    approvals: list[ApprovalRecord]
    # the run's pending approvals of other checkpoints, by id in id order
    pending_elsewhere: list[str]
    # whether the run has input staged on its thread
    staged_input: bool


class ApprovalRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    @staticmethod
    def insert_in(conn: Connection, records: Sequence[ApprovalRecord]) -> None:
        _INSERT.many(conn, [r.values() for r in records])

    async def get(self, approval_id: str) -> ApprovalRecord | None:
        return await self._store.read(partial(self.get_in, approval_id=approval_id))

    @staticmethod
    def get_in(conn: Connection, approval_id: str) -> ApprovalRecord | None:
        row = _BY_ID.record(conn, {"b_approval": approval_id})
        return ApprovalRecord.from_row(row) if row else None

    @staticmethod
    def with_run_and_thread_in(
        conn: Connection, approval_id: str
    ) -> tuple[ApprovalRecord | None, RunRecord | None, ThreadRecord | None]:
        """The approval, its run and the run's thread (None where a row is missing, or the
        thread deleted), in one statement: a decision reads them before and again under the
        thread's lock, and on PostgreSQL each statement is a round trip."""
        row = _WITH_RUN_AND_THREAD.record(conn, {"b_approval": approval_id})
        if row is None:
            return None, None, None
        parts: dict[str, dict[str, Any]] = {"a": {}, "r": {}, "t": {}}
        for key, value in row.items():
            prefix, _, column = key.partition("_")
            parts[prefix][column] = value
        approval, run, thread = parts["a"], parts["r"], parts["t"]
        return (
            ApprovalRecord.from_row(approval),
            RunRecord.from_row(run) if run["run_id"] is not None else None,
            ThreadRecord.from_row(thread) if thread["thread_id"] is not None else None,
        )

    async def for_checkpoint(self, run_id: str, checkpoint_version: int) -> list[ApprovalRecord]:
        return await self._store.read(
            partial(self.for_checkpoint_in, run_id=run_id, checkpoint_version=checkpoint_version)
        )

    @staticmethod
    def for_checkpoint_in(
        conn: Connection, run_id: str, checkpoint_version: int
    ) -> list[ApprovalRecord]:
        rows = _OF_CHECKPOINT.records(conn, {"b_run": run_id, "b_version": checkpoint_version})
        return [ApprovalRecord.from_row(row) for row in rows]

    @staticmethod
    def of_pause_in(
        conn: Connection, run_id: str, checkpoint_version: int, thread_id: str
    ) -> PauseApprovals:
        """The approvals of the run's pause at `checkpoint_version` (as `for_checkpoint_in`),
        the ids of its pending approvals of any other checkpoint (a pause a continuation from
        this one leaves behind), and whether the run has input staged on `thread_id`, in one
        read."""
        rows = _OF_PAUSE.records(
            conn,
            {
                "b_run": run_id,
                "b_version": checkpoint_version,
                "b_thread": thread_id,
                "b_disposition": Disposition.STAGED.value,
            },
        )
        pause, elsewhere = [], []
        for row in rows:
            if row["approval_id"] is None:
                continue  # no approval: the row says only whether input is staged
            record = ApprovalRecord.from_row(row)
            if record.checkpoint_version == checkpoint_version:
                pause.append(record)
            else:
                elsewhere.append(record.approval_id)
        return PauseApprovals(pause, sorted(elsewhere), bool(rows[0]["b_staged"]))

    async def latest_decision(self, run_id: str) -> ApprovalRecord | None:
        """The run's most recently decided approval (approved, rejected or expired)."""

        def read(conn: Connection) -> ApprovalRecord | None:
            row = conn.execute(_LATEST_DECISION, {"b_run": run_id}).mappings().first()
            return ApprovalRecord.from_row(row) if row else None

        return await self._store.read(read)

    async def count_pending(self) -> int:
        """Approvals waiting for a decision, in every tenant: a count over the leading column
        of `ix_approvals_status_expires`, read by each metrics scrape."""
        query = (
            select(func.count())
            .select_from(approvals)
            .where(approvals.c.status == ApprovalStatus.PENDING.value)
        )

        def count(conn: Connection) -> int:
            return int(conn.execute(query).scalar_one())

        return await self._store.read(count)

    async def pending_for_tenant(self, tenant: str, limit: int = 500) -> list[ApprovalRecord]:
        return await self.pending(tenant=tenant, limit=limit)

    async def pending(self, *, tenant: str | None = None, limit: int = 500) -> list[ApprovalRecord]:
        """Pending approvals, the longest waiting first; of one tenant, or of all of them."""
        query = select(approvals).where(approvals.c.status == ApprovalStatus.PENDING.value)
        if tenant is not None:
            query = query.where(approvals.c.tenant == tenant)
        query = query.order_by(approvals.c.requested_at, approvals.c.approval_id).limit(limit)
        return await self._store.read(partial(_records, query=query))

    @staticmethod
    def decide_in(
        conn: Connection,
        approval_id: str,
        *,
        status: ApprovalStatus,
        reviewer: str,
        reason: str | None,
        checkpoint_version: int,
        decided_at: datetime,
        edited_arguments: dict[str, Any] | None = None,
        audit: AuditEntry | None = None,
    ) -> bool:
        """Record a decision if the approval is still pending at that checkpoint version, and
        then `audit`, its entry in the trail (on PostgreSQL in the same statement).

        False when someone else decided first or the run moved on: decided at most once.
        """
        return _settle_pending_in(
            conn,
            approval_id,
            checkpoint_version,
            status=status.value,
            reviewer=reviewer,
            reason=reason,
            decided_at=decided_at,
            edited_arguments=edited_arguments,
            audit=audit,
        )

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
        return await self._store.read(partial(_records, query=query))

    @staticmethod
    def expire_in(
        conn: Connection,
        approval_id: str,
        *,
        reason: str,
        checkpoint_version: int,
        decided_at: datetime,
    ) -> bool:
        """Reject a pending approval on behalf of the system (no reviewer); at most once."""
        return _settle_pending_in(
            conn,
            approval_id,
            checkpoint_version,
            status=ApprovalStatus.EXPIRED.value,
            reviewer=None,
            reason=reason,
            decided_at=decided_at,
        )

    @staticmethod
    def supersede_in(conn: Connection, approval_ids: Sequence[str], *, reason: str) -> list[str]:
        """Mark these approvals superseded unless already superseded or expired; returns the
        ids that changed. Also used for approved rows that turned out not to bind to their
        call, so the record never claims an approval that was not applied."""
        if not approval_ids:
            return []
        ids = list(conn.execute(_OPEN_OF, {"b_ids": list(approval_ids)}).scalars())
        now = utcnow()
        _SUPERSEDE_FOR.many(
            conn,
            [{"b_approval": approval_id, "b_now": now, "b_reason": reason} for approval_id in ids],
        )
        return ids

    @staticmethod
    def supersede_pending_in(
        conn: Connection, run_id: str, pending: list[str] | None = None
    ) -> list[str]:
        """Mark every pending approval of the run superseded; returns their ids. `pending`:
        those ids in id order, when the caller's transaction read them already."""
        if pending is None:
            pending = [
                approval_id for (approval_id,) in _PENDING_OF_RUN.rows(conn, {"b_run": run_id})
            ]
        now = utcnow()
        _SUPERSEDE.many(
            conn, [{"b_approval": approval_id, "b_now": now} for approval_id in pending]
        )
        return pending


# A new approval's row: every field of the record (`ApprovalRecord.values`).
_INSERT = Prepared(approvals.insert(), keys=[field.name for field in fields(ApprovalRecord)])
# Ids in id order, so concurrent transactions lock the rows in one order.
_OPEN_OF = (
    select(approvals.c.approval_id)
    .where(
        approvals.c.approval_id.in_(bindparam("b_ids", expanding=True)),
        approvals.c.status.in_(
            [
                ApprovalStatus.PENDING.value,
                ApprovalStatus.APPROVED.value,
                ApprovalStatus.REJECTED.value,
            ]
        ),
    )
    .order_by(approvals.c.approval_id)
)
_PENDING_OF_RUN = Prepared(
    select(approvals.c.approval_id)
    .where(
        approvals.c.run_id == bindparam("b_run"),
        approvals.c.status == ApprovalStatus.PENDING.value,
    )
    .order_by(approvals.c.approval_id)
)
# One approval at a time (an executemany over the ids, in id order): the SQL stays the same.
_SUPERSEDE_ONE = (
    update(approvals)
    .where(approvals.c.approval_id == bindparam("b_approval"))
    .values(status=ApprovalStatus.SUPERSEDED.value, decided_at=bindparam("b_now"))
)
_SUPERSEDE = Prepared(_SUPERSEDE_ONE)
_SUPERSEDE_FOR = Prepared(_SUPERSEDE_ONE.values(reason=bindparam("b_reason")))
_BY_ID = Prepared(select(approvals).where(approvals.c.approval_id == bindparam("b_approval")))


def _prefixed(table: Table, prefix: str) -> list[Label[Any]]:
    """The table's columns labelled `<prefix>_<column>`, to tell them apart in a join."""
    return [column.label(f"{prefix}_{column.key}") for column in table.c]


_WITH_RUN_AND_THREAD = Prepared(
    select(*_prefixed(approvals, "a"), *_prefixed(runs, "r"), *_prefixed(threads, "t"))
    .select_from(
        approvals.outerjoin(runs, runs.c.run_id == approvals.c.run_id).outerjoin(
            threads, and_(threads.c.thread_id == runs.c.thread_id, threads.c.deleted_at.is_(None))
        )
    )
    .where(approvals.c.approval_id == bindparam("b_approval"))
)
_SETTLE_PENDING = (
    update(approvals)
    .where(
        approvals.c.approval_id == bindparam("b_approval"),
        approvals.c.status == ApprovalStatus.PENDING.value,
        approvals.c.checkpoint_version == bindparam("b_version"),
    )
    .values(
        status=bindparam("b_status"),
        reviewer=bindparam("b_reviewer"),
        reason=bindparam("b_reason"),
        decided_at=bindparam("b_decided_at"),
        edited_arguments=bindparam("b_edited", type_=JSON),
    )
)
_SETTLE = Prepared(_SETTLE_PENDING)
# PostgreSQL: the settlement and its audit entry in one statement, the entry inserted only if
# the approval was settled (its row count says whether).
_SETTLE_AUDITED = Prepared(
    AuditRepository.inserted_for(_SETTLE_PENDING.returning(approvals.c.approval_id).cte("settled"))
)
# Not prepared: the status list is an expanding IN.
_LATEST_DECISION = (
    select(approvals)
    .where(
        approvals.c.run_id == bindparam("b_run"),
        approvals.c.status.in_(
            [
                ApprovalStatus.APPROVED.value,
                ApprovalStatus.REJECTED.value,
                ApprovalStatus.EXPIRED.value,
            ]
        ),
    )
    .order_by(approvals.c.decided_at.desc(), approvals.c.approval_id.desc())
    .limit(1)
)
_OF_CHECKPOINT = Prepared(
    select(approvals)
    .where(
        approvals.c.run_id == bindparam("b_run"),
        approvals.c.checkpoint_version == bindparam("b_version"),
    )
    .order_by(approvals.c.requested_at, approvals.c.approval_id)
)

# A pause's approvals, with the run's pending ones of other checkpoints, each row telling
# whether the run has input staged (one row with no approval when it has none).
_STAGED = select(InputRepository.open_of_run().label("b_staged")).subquery("staged")
_OF_PAUSE = Prepared(
    select(_STAGED.c.b_staged, approvals)
    .select_from(
        _STAGED.outerjoin(
            approvals,
            and_(
                approvals.c.run_id == bindparam("b_run"),
                or_(
                    approvals.c.checkpoint_version == bindparam("b_version"),
                    approvals.c.status == ApprovalStatus.PENDING.value,
                ),
            ),
        )
    )
    .order_by(approvals.c.requested_at, approvals.c.approval_id)
)


def _records(
    conn: Connection, query: Select[Any], params: dict[str, Any] | None = None
) -> list[ApprovalRecord]:
    return [ApprovalRecord.from_row(row) for row in conn.execute(query, params).mappings()]


def _settle_pending_in(
    conn: Connection,
    approval_id: str,
    checkpoint_version: int,
    *,
    status: str,
    reviewer: str | None,
    reason: str | None,
    decided_at: datetime,
    edited_arguments: dict[str, Any] | None = None,
    audit: AuditEntry | None = None,
) -> bool:
    """Record the outcome only while the approval is pending at that checkpoint version, so a
    reviewer, a concurrent reviewer and the expiry sweep settle it once between them; and
    `audit` if it was recorded."""
    params = {
        "b_approval": approval_id,
        "b_version": checkpoint_version,
        "b_status": status,
        "b_reviewer": reviewer,
        "b_reason": reason,
        "b_decided_at": decided_at,
        "b_edited": edited_arguments,
    }
    if audit is not None and conn.dialect.name == "postgresql":
        return _SETTLE_AUDITED.rowcount(conn, {**params, **AuditRepository.params(audit)}) == 1
    settled = _SETTLE.rowcount(conn, params) == 1
    if settled and audit is not None:
        AuditRepository.insert_in(conn, audit)
    return settled
