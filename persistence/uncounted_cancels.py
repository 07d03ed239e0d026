"""Cancels that no gateway process has counted yet: those of the operator's command line.

A gateway process counts `gateway_runs_total{state="cancelled"}` as it stores `run.cancelled`
(gateway/observability/metrics.py). The operator's `runs cancel` stores it from a process of its
own, which counts nothing, so it also records the cancel here, in the transaction that cancels
(`record_in`). Gateway processes then claim these rows (`UncountedCancels.claim`): one
statement deletes the rows it returns, so a row is claimed, and counted, by exactly one
process, however many share the database. On PostgreSQL the claim skips the rows another
claim has locked instead of waiting for them (they are that claim's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Connection

from persistence.clock import utcnow
from persistence.tables import uncounted_cancels

if TYPE_CHECKING:
    from persistence.store import Store

# Rows taken by one claim: a caller wanting them all claims again until a claim returns fewer.
CLAIM_BATCH = 500

_table = uncounted_cancels


def record_in(conn: Connection, run_id: str, agent: str) -> None:
    """Leave the cancel of `run_id` (a run of `agent`) to be counted by a gateway process."""
    conn.execute(insert(_table).values(run_id=run_id, agent=agent, cancelled_at=utcnow()))


def claim_in(conn: Connection, limit: int = CLAIM_BATCH) -> list[str]:
    """Take (delete) up to `limit` uncounted cancels, the oldest first; the agent of each."""
    batch = (
        select(_table.c.run_id)
        .order_by(_table.c.cancelled_at)
        .limit(limit)
        .with_for_update(skip_locked=True)  # PostgreSQL; SQLite has one writer at a time
    )
    claimed = delete(_table).where(_table.c.run_id.in_(batch)).returning(_table.c.agent)
    return list(conn.execute(claimed).scalars())


class UncountedCancels:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def claim(self, limit: int = CLAIM_BATCH) -> list[str]:
        """Up to `limit` cancels this process is now the one to count (no other process will
        be given them); the agent of each."""
        return await self._store.write(lambda conn: claim_in(conn, limit))

    async def waiting(self) -> int:
        """How many cancels wait to be counted."""
        count = select(func.count()).select_from(_table)
        return await self._store.read(lambda conn: int(conn.execute(count).scalar_one()))
