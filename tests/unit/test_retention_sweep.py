"""`RetentionRepository.sweep` (persistence/retention.py) on a migrated SQLite file: ended runs
lose their checkpoints and their prefix of the log once, are marked swept and never looked at
again; an active run and everything after the cut are kept. And `EventRepository.for_run`
finds a run's events through its thread (the log has no index by run)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from persistence.checkpoints import CheckpointRecord, CheckpointRepository
from persistence.db import transaction, utcnow
from persistence.events import EventRepository, NewEvent
from persistence.retention import RetentionRepository, SweepResult
from persistence.runs import RunStatus
from persistence.tables import checkpoints, runs
from persistence.threads import ThreadRepository
from tests.support.storage import insert_running_run, migrated_engine


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(tmp_path / "retention.db") as engine:
        yield engine


def event(thread_id: str, run_id: str, type_: str) -> NewEvent:
    return NewEvent(thread_id, run_id, type_, "2026-01-01T00:00:00.000Z", "{}", None)


async def end_long_ago(engine: AsyncEngine, run_id: str) -> None:
    async with transaction(engine) as conn:
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == run_id)
            .values(status=RunStatus.COMPLETED.value, updated_at=utcnow() - timedelta(days=2))
        )


async def test_ended_runs_are_swept_once_and_the_rest_is_kept(engine: AsyncEngine) -> None:
    thread = await ThreadRepository(engine).create(tenant="acme", owner="alice")
    t = thread.thread_id
    log = EventRepository(engine)
    # Runs on a thread are sequential: each ends before the next starts.
    for run_id in ("r_old1", "r_old2", "r_live"):
        await insert_running_run(engine, run_id, t)
        await log.append_batch([event(t, run_id, "run.started"), event(t, run_id, "tool.output")])
        if run_id == "r_old1":
            async with transaction(engine) as conn:
                await CheckpointRepository.save_in(
                    conn,
                    CheckpointRecord(
                        run_id=run_id,
                        version=1,
                        state="{}",
                        sdk_schema_version="1",
                        graph_name="assistant",
                        graph_version="1",
                        reason="turn",
                        session_mark=0,
                        created_at=utcnow(),
                    ),
                    status=RunStatus.RUNNING,
                    expected=(RunStatus.RUNNING,),
                )
        if run_id != "r_live":
            await end_long_ago(engine, run_id)
    retention = RetentionRepository(engine)
    cutoff = utcnow() - timedelta(days=1)

    first = await retention.sweep(cutoff)
    assert first == SweepResult(runs=2, threads=1, events=4, checkpoints=1)
    remaining = await log.read(t, after_seq=0, limit=100)
    assert [(e.seq, e.run_id) for e in remaining] == [(5, "r_live"), (6, "r_live")]
    async with transaction(engine) as conn:
        swept = dict((await conn.execute(select(runs.c.run_id, runs.c.swept_at))).all())
        left = (await conn.execute(select(checkpoints.c.run_id))).all()
    assert swept["r_old1"] is not None and swept["r_old2"] is not None
    assert swept["r_live"] is None and left == []

    # Swept runs are not looked at again; the live run is untouched.
    assert await retention.sweep(cutoff) == SweepResult(0, 0, 0, 0)
    outputs = await log.for_run(t, "r_live", ("tool.output",))
    assert [(e.seq, e.type) for e in outputs] == [(6, "tool.output")]
    assert await log.for_run(t, "r_old1", ("tool.output",)) == []
