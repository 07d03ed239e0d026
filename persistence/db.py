"""Engine creation and schema migration.

The database URL decides the backend. SQLite (the default) gets WAL, a busy timeout and
`synchronous=NORMAL`: in WAL mode that keeps every committed transaction durable across a
process crash (the gateway's crash model) while letting readers run beside the single writer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from persistence.errors import StorageUnavailable

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

_DRIVER_HINTS = {
    "asyncpg": "pip install asyncpg",
    "aiomysql": "pip install aiomysql",
    "aiosqlite": "pip install aiosqlite",
}


class DatabaseConfigError(ValueError):
    """The database URL cannot be used (wrong scheme, missing driver)."""


def create_engine(url: str, *, echo: bool = False) -> AsyncEngine:
    parsed = make_url(url)
    if not parsed.drivername or "+" not in parsed.drivername:
        raise DatabaseConfigError(
            f"database URL must name an async driver, e.g. sqlite+aiosqlite:///./gateway.db "
            f"(got scheme {parsed.drivername!r})"
        )
    driver = parsed.drivername.split("+", 1)[1]
    kwargs: dict[str, Any] = {"echo": echo}
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:":
            Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"timeout": 30}
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_async_engine(parsed, **kwargs)
    except ModuleNotFoundError as exc:
        hint = _DRIVER_HINTS.get(driver, f"install the {driver!r} driver")
        raise DatabaseConfigError(f"database driver {driver!r} is not installed ({hint})") from exc
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def pin_sqlite_busy_timeout(engine: AsyncEngine) -> None:
    """Re-assert the gateway's busy timeout after other libraries added connect listeners.

    The SDK's SQLAlchemySession registers its own listener (busy_timeout=5000) on first use;
    connect listeners run in registration order, so this one, added after it, has the last word.
    """
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_busy_timeout)


def _sqlite_busy_timeout(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA busy_timeout=30000")
    finally:
        cursor.close()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _alembic_config(connection: Connection) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    import logging

    # Alembic narrates every plugin and revision at INFO; the gateway logs the outcome itself.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from alembic import command

    command.upgrade(_alembic_config(connection), "head")


async def migrate(engine: AsyncEngine) -> None:
    """Create the schema or bring it to the newest revision (idempotent)."""
    async with engine.begin() as connection:
        await connection.run_sync(_upgrade)


@asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One transaction; database failures surface as `StorageUnavailable`.

    Integrity errors are programming or race signals, not outages, so they pass through.
    """
    try:
        async with engine.begin() as connection:
            yield connection
    except IntegrityError:
        raise
    except (OperationalError, InterfaceError, DBAPIError, OSError) as exc:
        raise StorageUnavailable(f"storage unavailable: {type(exc).__name__}") from exc


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything the gateway stores is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
