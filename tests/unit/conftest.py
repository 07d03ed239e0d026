"""Fixtures shared by the event log's unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.event_log.bus import EventBus
from gateway.event_log.writer import EventLog
from persistence.threads import ThreadRepository
from tests.support.storage import migrated_store, running_event_log


@pytest.fixture
async def log_and_thread(tmp_path: Path) -> AsyncIterator[tuple[EventLog, str, EventBus]]:
    """A running event log on a fresh SQLite file, one thread in it, and the log's bus."""
    bus = EventBus()
    async with migrated_store(f"sqlite:///{tmp_path / 'log.db'}") as store:
        thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
        async with running_event_log(store, bus) as log:
            yield log, thread.thread_id, bus
