"""`RetentionRepository.sweep` (persistence/retention.py) on a migrated SQLite store: ended runs
lose their checkpoints and their prefix of the log once, are marked swept and never looked at
again; an active run and everything after the cut are kept. And `EventRepository.for_run`
finds a run's events through its thread (the log has no index by run)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from gateway.event_log.bus import EventBus
from gateway.event_log.subscription import ReplayCut, Subscription, resume_point
from persistence.checkpoints import CheckpointRecord, CheckpointRepository
from persistence.clock import utcnow
from persistence.events import EventRepository, NewEvent, append_in
from persistence.retention import RetentionRepository, SweepResult
from persistence.runs import RunStatus
from persistence.store import Store
from persistence.tables import checkpoints, runs
from persistence.threads import ThreadRepository
from tests.support.storage import insert_running_run, migrated_store, running_event_log, seq_of


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with migrated_store(f"sqlite:///{tmp_path / 'retention.db'}") as store:
        yield store


def event(thread_id: str, run_id: str, type_: str) -> NewEvent:
    return NewEvent(thread_id, run_id, type_, "2026-01-01T00:00:00.000Z", "{}", None)


async def end_long_ago(store: Store, run_id: str) -> None:
    await store.write(
        lambda conn: conn.execute(
            update(runs)
            .where(runs.c.run_id == run_id)
            .values(status=RunStatus.COMPLETED.value, updated_at=utcnow() - timedelta(days=2))
        )
    )


def checkpoint(run_id: str) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=run_id,
        version=1,
        state="{}",
        sdk_schema_version="1",
        graph_name="assistant",
        graph_version="1",
        reason="turn",
        session_mark=0,
        created_at=utcnow(),
    )


def save_checkpoint_in(conn: Connection, run_id: str) -> CheckpointRecord:
    return CheckpointRepository.save_in(
        conn, checkpoint(run_id), status=RunStatus.RUNNING, expected=(RunStatus.RUNNING,)
    )


def swept_and_checkpoints_in(conn: Connection) -> tuple[dict[str, Any], list[Any]]:
    swept = {run_id: at for run_id, at in conn.execute(select(runs.c.run_id, runs.c.swept_at))}
    left = list(conn.execute(select(checkpoints.c.run_id)).scalars())
    return swept, left


async def test_ended_runs_are_swept_once_and_the_rest_is_kept(store: Store) -> None:
    thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
    t = thread.thread_id
    log = EventRepository(store)
    # Runs on a thread are sequential: each ends before the next starts.
    for run_id in ("r_old1", "r_old2", "r_live"):
        await insert_running_run(store, run_id, t)
        batch = [event(t, run_id, "run.started"), event(t, run_id, "tool.output")]
        await store.write(partial(append_in, batch=batch))
        if run_id == "r_old1":
            await store.write(partial(save_checkpoint_in, run_id=run_id))
        if run_id != "r_live":
            await end_long_ago(store, run_id)
    retention = RetentionRepository(store)
    cutoff = utcnow() - timedelta(days=1)

    first = await retention.sweep(cutoff)
    assert first == SweepResult(runs=2, threads=1, events=4, checkpoints=1)
    remaining = await log.read(t, after_seq=0, limit=100)
    assert [(e.seq, e.run_id) for e in remaining] == [(5, "r_live"), (6, "r_live")]
    swept, left = await store.read(swept_and_checkpoints_in)
    assert swept["r_old1"] is not None and swept["r_old2"] is not None
    assert swept["r_live"] is None and left == []

    # Swept runs are not looked at again; the live run is untouched.
    assert await retention.sweep(cutoff) == SweepResult(0, 0, 0, 0)
    outputs = await log.for_run(t, "r_live", ("tool.output",))
    assert [(e.seq, e.type) for e in outputs] == [(6, "tool.output")]
    assert await log.for_run(t, "r_old1", ("tool.output",)) == []


async def test_a_replay_the_sweep_cuts_under_its_cursor_ends_instead_of_skipping(
    store: Store,
) -> None:
    """A subscription replaying an old run when the sweep removes it: it must not go on after
    the cut as if nothing were missing (its client would never learn); it ends, and a new
    subscription from its cursor is told `reset`."""
    thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
    t = thread.thread_id
    # Events of 20 KB: replay pages of a few dozen, so most of the old run is read after the
    # sweep has removed it.
    large = NewEvent(t, "r_old", "tool.output", "2026-01-01T00:00:00.000Z", "x" * 20_000, None)
    await insert_running_run(store, "r_old", t)
    await store.write(partial(append_in, batch=[large] * 200))
    await end_long_ago(store, "r_old")
    await insert_running_run(store, "r_new", t)
    await store.write(partial(append_in, batch=[event(t, "r_new", "tool.output")] * 3))
    bus = EventBus()
    async with running_event_log(store, bus) as log:
        received: list[int] = []
        stalled, reader_may_go_on = asyncio.Event(), asyncio.Event()

        async def slow_reader(frame: str) -> None:
            received.append(seq_of(frame))
            if len(received) == 20:
                stalled.set()
                await reader_may_go_on.wait()

        subscription = Subscription(
            thread_id=t,
            after_seq=0,
            bus=bus,
            log=log,
            send_replay=slow_reader,
            send_live=lambda frame, _committed: False,
        )
        subscription.start()
        await asyncio.wait_for(stalled.wait(), 5)
        swept = await RetentionRepository(store).sweep(utcnow() - timedelta(days=1))
        assert swept.events == 200
        reader_may_go_on.set()
        assert subscription.task is not None
        with pytest.raises(ReplayCut):
            await asyncio.wait_for(subscription.task, 5)
        subscription.close()
    # Only what came before the cut, in order; nothing after it was taken as if it followed.
    assert received == list(range(1, len(received) + 1)) and len(received) < 200
    cut = await ThreadRepository(store).get(t)
    assert cut is not None
    assert resume_point(cut, received[-1], cut.epoch) == (0, True)


async def test_a_subscription_from_a_cursor_already_cut_starts_at_the_first_stored_event(
    store: Store,
) -> None:
    """A cut made before the subscription's first read is not one made under its replay: a
    caller that follows from an old cursor (the frontends' streams, which build their view from
    what the log holds) gets the log from its first stored event, and follows it live."""
    thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
    t = thread.thread_id
    await insert_running_run(store, "r_old", t)
    await store.write(partial(append_in, batch=[event(t, "r_old", "tool.output")] * 10))
    await end_long_ago(store, "r_old")
    await RetentionRepository(store).sweep(utcnow() - timedelta(days=1))
    await insert_running_run(store, "r_new", t)
    await store.write(partial(append_in, batch=[event(t, "r_new", "tool.output")] * 3))
    bus = EventBus()
    async with running_event_log(store, bus) as log:
        received: list[int] = []
        three = asyncio.Event()

        def take(frame: str, _committed: float = 0.0) -> bool:
            received.append(seq_of(frame))
            if len(received) == 3:
                three.set()
            return True

        subscription = Subscription(
            thread_id=t, after_seq=4, bus=bus, log=log, send_replay=take, send_live=take
        )
        subscription.start()
        await asyncio.wait_for(three.wait(), 5)
        assert subscription.task is not None and not subscription.task.done()
        subscription.close()
    assert received == [11, 12, 13]
