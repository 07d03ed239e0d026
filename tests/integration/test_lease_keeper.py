"""LeaseKeeper: one renewal for every lease this process holds; a lost lease stops its holder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from gateway.event_log.writer import EventLog
from gateway.observability.log_fields import bound, current
from gateway.run_lifecycle.lease_keeper import LeaseKeeper
from persistence.clock import utcnow
from persistence.leases import Lease, LeaseRepository
from persistence.store import Store
from persistence.tables import runs
from persistence.threads import ThreadRepository
from tests.support.storage import insert_running_run, migrated_store, running_event_log


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with migrated_store(f"sqlite:///{tmp_path / 'keeper.db'}") as store:
        yield store


@pytest.fixture
async def event_log(store: Store) -> AsyncIterator[EventLog]:
    async with running_event_log(store) as log:
        yield log


async def a_leased_run(store: Store, run_id: str, owner: str = "gw-a") -> Lease:
    thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
    await insert_running_run(store, run_id, thread.thread_id)
    lease = await LeaseRepository(store).acquire(run_id, owner, ttl_s=30)
    assert lease is not None
    return lease


async def expiry(store: Store, run_id: str):
    return await store.read(
        lambda conn: conn.execute(
            select(runs.c.lease_expires_at).where(runs.c.run_id == run_id)
        ).scalar_one()
    )


async def test_one_renewal_extends_every_held_lease_and_reports_the_lost_ones(
    store: Store, event_log: EventLog
) -> None:
    kept, taken = await a_leased_run(store, "r_kept"), await a_leased_run(store, "r_taken")
    # r_taken's owner stalled past its expiry and another process took the run over.
    await store.write(
        lambda conn: conn.execute(
            update(runs)
            .where(runs.c.run_id == "r_taken")
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
    )
    assert await LeaseRepository(store).acquire("r_taken", "gw-b", ttl_s=30) is not None
    taken_expiry = await expiry(store, "r_taken")
    kept_expiry = await expiry(store, "r_kept")

    keeper = LeaseKeeper(event_log, ttl_s=600)
    lost: list[str] = []
    try:
        keeper.hold(kept, lambda: lost.append("r_kept"))
        keeper.hold(taken, lambda: lost.append("r_taken"))
        await keeper.renew()
        assert lost == ["r_taken"]
        assert keeper.held == {kept}
        assert await expiry(store, "r_kept") > kept_expiry + timedelta(seconds=500)
        assert await expiry(store, "r_taken") == taken_expiry  # gw-b's lease, untouched
        # A dropped lease is no longer renewed.
        keeper.drop(kept)
        before = await expiry(store, "r_kept")
        await keeper.renew()
        assert await expiry(store, "r_kept") == before
        assert lost == ["r_taken"]
    finally:
        await keeper.close()


async def test_the_keeper_renews_on_its_own_every_third_of_the_ttl(
    store: Store, event_log: EventLog
) -> None:
    lease = await a_leased_run(store, "r_live")
    first = await expiry(store, "r_live")
    keeper = LeaseKeeper(event_log, ttl_s=1.5)
    try:
        keeper.hold(lease, lambda: None)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if await expiry(store, "r_live") != first:
                break
        renewed = await expiry(store, "r_live")
        assert renewed != first
        # Taken over meanwhile: the next tick tells the holder.
        await store.write(
            lambda conn: conn.execute(
                update(runs).where(runs.c.run_id == "r_live").values(lease_token=lease.token + 1)
            )
        )
        stopped = asyncio.Event()
        keeper.hold(lease, stopped.set)
        await asyncio.wait_for(stopped.wait(), timeout=5)
        assert keeper.held == frozenset()
    finally:
        await keeper.close()


async def test_the_keeper_carries_no_run_s_log_fields_whichever_run_started_it(
    store: Store, event_log: EventLog
) -> None:
    """The keeper is started by the first run that holds a lease (at start-up, a recovered
    one), and reports lost leases of every run: its calls must not carry that first run's
    thread_id/run_id (a lease-loss warning of one run was tagged with another's)."""
    first, second = await a_leased_run(store, "r_first"), await a_leased_run(store, "r_second")
    # Renewing every 0.1 s: the keeper's own task reports the loss.
    keeper = LeaseKeeper(event_log, ttl_s=0.3)
    seen: list[dict[str, str]] = []
    reported = asyncio.Event()

    def lost() -> None:
        seen.append(current())
        reported.set()

    try:
        with bound(thread_id="t_first", run_id="r_first", agent="assistant"):
            keeper.hold(first, lambda: None)
        keeper.hold(second, lost)
        # Taken from this process (a cancel from elsewhere): its next renewal finds it lost.
        await store.write(lambda conn: LeaseRepository.revoke_in(conn, "r_second"))
        await asyncio.wait_for(reported.wait(), 10)
        assert seen == [{}], seen
    finally:
        await keeper.close()
