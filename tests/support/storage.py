"""A migrated SQLite file, an event log on it and a leased run, for tests below the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.bus import EventBus
from gateway.eventlog import EventLog
from persistence.db import create_engine, migrate, transaction, utcnow
from persistence.tables import runs


@asynccontextmanager
async def migrated_engine(db_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(f"sqlite+aiosqlite:///{db_path}")
    await migrate(engine)
    try:
        yield engine
    finally:
        await engine.dispose()


@asynccontextmanager
async def running_event_log(
    engine: AsyncEngine, bus: EventBus | None = None
) -> AsyncIterator[EventLog]:
    log = EventLog(engine, bus or EventBus())
    await log.start()
    try:
        yield log
    finally:
        await log.close()


async def insert_running_run(engine: AsyncEngine, run_id: str, thread_id: str) -> None:
    """A `running` run row on `thread_id`, with no lease yet."""
    async with transaction(engine) as conn:
        await conn.execute(
            runs.insert().values(
                run_id=run_id,
                thread_id=thread_id,
                tenant="acme",
                owner="alice",
                status="running",
                agent="assistant",
                graph_version="1",
                on_disconnect="continue",
                input="hi",
                checkpoint_version=0,
                session_mark=0,
                created_at=utcnow(),
                updated_at=utcnow(),
            )
        )
