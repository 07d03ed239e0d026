"""What a thread list shows of each thread besides its row: the newest run's status, when
the thread last changed, and how many approvals wait on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection

from persistence.approvals import ApprovalStatus
from persistence.clock import as_utc
from persistence.tables import approvals, runs
from persistence.threads import ThreadRecord

if TYPE_CHECKING:
    from persistence.store import Store


@dataclass(frozen=True)
class ThreadSummary:
    thread: ThreadRecord
    # The newest run's id and status; None before the thread's first run.
    run_id: str | None
    status: str | None
    # The newest of the thread's creation and its newest run's last change.
    last_activity_at: datetime
    pending_approvals: int


class ThreadSummaries:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def of(self, records: Sequence[ThreadRecord]) -> list[ThreadSummary]:
        """A summary of each of `records` (at most a few hundred), in order."""
        if not records:
            return []
        return await self._store.read(lambda conn: summaries_in(conn, records))


def summaries_in(conn: Connection, records: Sequence[ThreadRecord]) -> list[ThreadSummary]:
    ids = [record.thread_id for record in records]
    newest = (
        select(runs.c.thread_id, func.max(runs.c.created_at).label("at"))
        .where(runs.c.thread_id.in_(ids))
        .group_by(runs.c.thread_id)
        .subquery()
    )
    latest = {
        row.thread_id: row
        for row in conn.execute(
            select(runs.c.thread_id, runs.c.run_id, runs.c.status, runs.c.updated_at).join(
                newest,
                and_(runs.c.thread_id == newest.c.thread_id, runs.c.created_at == newest.c.at),
            )
        )
    }
    # Pending approvals are few and indexed by tenant and status.
    waiting: dict[str, int] = dict(
        conn.execute(
            select(approvals.c.thread_id, func.count())
            .where(
                approvals.c.tenant.in_(sorted({record.tenant for record in records})),
                approvals.c.status == ApprovalStatus.PENDING.value,
                approvals.c.thread_id.in_(ids),
            )
            .group_by(approvals.c.thread_id)
        ).all()
    )
    summaries = []
    for record in records:
        run = latest.get(record.thread_id)
        changed = as_utc(run.updated_at) if run is not None else None
        summaries.append(
            ThreadSummary(
                thread=record,
                run_id=run.run_id if run is not None else None,
                status=run.status if run is not None else None,
                last_activity_at=max(record.created_at, changed or record.created_at),
                pending_approvals=int(waiting.get(record.thread_id, 0)),
            )
        )
    return summaries
