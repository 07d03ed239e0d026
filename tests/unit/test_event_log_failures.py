"""An event log whose writes fail for good: the callers that await their events get
`StorageUnavailable`; events nobody awaits (streamed deltas are not awaited one by one) fail
quietly, without asyncio's "Future exception was never retrieved" for each when it collects
them: the outage is reported once, by the storage health."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import gateway.event_log.writer as eventlog
from gateway.event_log.bus import EventBus
from gateway.event_log.writer import EventLog
from persistence.errors import StorageUnavailable
from persistence.threads import ThreadRepository
from tests.support.faults import Fault, StorageFaults, any_write
from tests.support.storage import migrated_store


async def test_unawaited_events_that_cannot_be_stored_fail_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The retries' pauses, shortened: what is tested is what happens after the last one.
    monkeypatch.setattr(eventlog, "RETRY_DELAYS_S", (0.01, 0.01))
    async with migrated_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
        faults = StorageFaults(store)
        faults.install()
        log = EventLog(store, EventBus())
        await log.start()
        unawaited: list[asyncio.Future[object]] = []
        try:
            faults.fail(any_write, Fault.DISK_FULL)
            awaited = await log.append(thread.thread_id, None, "run.started", {"input": "x"})
            for i in range(5):
                event = {"input": str(i)}
                unawaited.append(await log.append(thread.thread_id, None, "input.queued", event))
            with pytest.raises(StorageUnavailable):
                await awaited
            await log.flush()
        finally:
            faults.heal()
            await log.close()
            faults.remove()
    assert faults.hits >= 3  # the first attempt and both retries
    # asyncio logs "Future exception was never retrieved" for a failed future it collects
    # while this flag is set (read first: `exception()` clears it).
    assert [future._log_traceback for future in unawaited] == [False] * len(unawaited)
    assert all(isinstance(future.exception(), StorageUnavailable) for future in unawaited)
