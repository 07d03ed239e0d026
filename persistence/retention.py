"""Retention: drop the checkpoints and event-log prefix of runs that ended long ago.

Runs on a thread are sequential, so the events of runs that ended before the cutoff form a
prefix of the thread's log. That prefix is deleted, `threads.truncated_seq` records where the
log now starts, and the thread gets a new epoch so subscribers holding an old cursor are told
to reset. Approvals (who decided what, and why), the operation ledger and the conversation
history are kept.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Connection

from persistence.clock import utcnow
from persistence.runs import TERMINAL
from persistence.tables import checkpoints, events, pending_inputs, runs, threads

if TYPE_CHECKING:
    from persistence.store import Store


@dataclass(frozen=True)
class SweepResult:
    runs: int
    threads: int
    events: int
    checkpoints: int


class RetentionRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def sweep(self, cutoff: datetime, *, limit: int = 500) -> SweepResult:
        terminal = [s.value for s in TERMINAL]
        query = (
            select(runs.c.run_id, runs.c.thread_id)
            .where(
                runs.c.status.in_(terminal),
                runs.c.updated_at < cutoff,
                runs.c.swept_at.is_(None),
            )
            .order_by(runs.c.run_id)
            .limit(limit)
        )
        expired = await self._store.read(lambda conn: [tuple(row) for row in conn.execute(query)])
        if not expired:
            return SweepResult(0, 0, 0, 0)
        return await self._store.write(partial(_sweep_in, expired=expired), slow=True)


def _sweep_in(conn: Connection, expired: list[tuple[str, str]]) -> SweepResult:
    run_ids = [run_id for run_id, _ in expired]
    # Run rows first, then thread rows, each in key order: the order every other transaction
    # that locks both takes them in.
    # Every event of these runs is at or below its thread's cut and their checkpoints are
    # about to go: nothing will be left to sweep of them.
    conn.execute(update(runs).where(runs.c.run_id.in_(run_ids)).values(swept_at=utcnow()))
    removed_checkpoints = (
        conn.execute(delete(checkpoints).where(checkpoints.c.run_id.in_(run_ids))).rowcount or 0
    )
    conn.execute(
        delete(pending_inputs).where(
            pending_inputs.c.run_id.in_(run_ids), pending_inputs.c.consumed_at.is_not(None)
        )
    )
    removed_events = touched = 0
    for thread_id in sorted({thread_id for _, thread_id in expired}):
        cut = conn.execute(
            select(func.max(events.c.seq)).where(
                events.c.thread_id == thread_id, events.c.run_id.in_(run_ids)
            )
        ).scalar()
        if cut is None:
            continue
        removed_events += (
            conn.execute(
                delete(events).where(events.c.thread_id == thread_id, events.c.seq <= cut)
            ).rowcount
            or 0
        )
        conn.execute(
            update(threads)
            .where(threads.c.thread_id == thread_id)
            .values(truncated_seq=cut, epoch=secrets.token_hex(4))
        )
        touched += 1
    return SweepResult(len(run_ids), touched, removed_events, removed_checkpoints)
