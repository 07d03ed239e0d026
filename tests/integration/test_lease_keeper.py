"""LeaseKeeper: one renewal for every lease this process holds; a lost lease stops its holder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.eventlog import EventLog
from gateway.lease_keeper import LeaseKeeper
from persistence.db import transaction, utcnow
from persistence.leases import Lease, LeaseRepository
from persistence.tables import runs
from persistence.threads import ThreadRepository
from tests.support.storage import insert_running_run, migrated_engine, running_event_log


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(tmp_path / "keeper.db") as engine:
        yield engine


@pytest.fixture
async def event_log(engine: AsyncEngine) -> AsyncIterator[EventLog]:
    async with running_event_log(engine) as log:
        yield log


async def a_leased_run(engine: AsyncEngine, run_id: str, owner: str = "gw-a") -> Lease:
    thread = await ThreadRepository(engine).create(tenant="acme", owner="alice")
    await insert_running_run(engine, run_id, thread.thread_id)
    lease = await LeaseRepository(engine).acquire(run_id, owner, ttl_s=30)
    assert lease is not None
    return lease


async def expiry(engine: AsyncEngine, run_id: str):
    async with transaction(engine) as conn:
        return (
            await conn.execute(select(runs.c.lease_expires_at).where(runs.c.run_id == run_id))
        ).scalar_one()


async def test_one_renewal_extends_every_held_lease_and_reports_the_lost_ones(
    engine: AsyncEngine, event_log: EventLog
) -> None:
    kept, taken = await a_leased_run(engine, "r_kept"), await a_leased_run(engine, "r_taken")
    # r_taken's owner stalled past its expiry and another process took the run over.
    async with transaction(engine) as conn:
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == "r_taken")
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
    assert await LeaseRepository(engine).acquire("r_taken", "gw-b", ttl_s=30) is not None
    taken_expiry = await expiry(engine, "r_taken")
    kept_expiry = await expiry(engine, "r_kept")

    keeper = LeaseKeeper(event_log, ttl_s=600)
    lost: list[str] = []
    try:
        keeper.hold(kept, lambda: lost.append("r_kept"))
        keeper.hold(taken, lambda: lost.append("r_taken"))
        await keeper.renew()
        assert lost == ["r_taken"]
        assert keeper.held == {kept}
        assert await expiry(engine, "r_kept") > kept_expiry + timedelta(seconds=500)
        assert await expiry(engine, "r_taken") == taken_expiry  # gw-b's lease, untouched
        # A dropped lease is no longer renewed.
        keeper.drop(kept)
        before = await expiry(engine, "r_kept")
        await keeper.renew()
        assert await expiry(engine, "r_kept") == before
        assert lost == ["r_taken"]
    finally:
        await keeper.close()


async def test_the_keeper_renews_on_its_own_every_third_of_the_ttl(
    engine: AsyncEngine, event_log: EventLog
) -> None:
    lease = await a_leased_run(engine, "r_live")
    first = await expiry(engine, "r_live")
    keeper = LeaseKeeper(event_log, ttl_s=1.5)
    try:
        keeper.hold(lease, lambda: None)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if await expiry(engine, "r_live") != first:
                break
        renewed = await expiry(engine, "r_live")
        assert renewed != first
        # Taken over meanwhile: the next tick tells the holder.
        async with transaction(engine) as conn:
            await conn.execute(
                update(runs).where(runs.c.run_id == "r_live").values(lease_token=lease.token + 1)
            )
        stopped = asyncio.Event()
        keeper.hold(lease, stopped.set)
        await asyncio.wait_for(stopped.wait(), timeout=5)
        assert keeper.held == frozenset()
    finally:
        await keeper.close()
