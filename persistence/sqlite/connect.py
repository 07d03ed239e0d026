"""Connections to a SQLite file, all with the same pragmas.

WAL with `synchronous=NORMAL` keeps every committed transaction durable across a process crash
(the gateway's crash model) while readers run beside the single writer.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

# How long a connection waits for a lock held elsewhere, when it waits at all.
BUSY_TIMEOUT_S = 30.0
PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}",
    "PRAGMA foreign_keys=ON",
)


def apply_pragmas(dbapi_connection: Any, _record: Any = None) -> None:
    cursor = dbapi_connection.cursor()
    try:
        for pragma in PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def open_connection(path: str) -> sqlite3.Connection:
    """A connection in autocommit mode (the store issues BEGIN IMMEDIATE / COMMIT itself), not
    bound to one thread: a lane uses it inline or on its own thread, never both at once."""
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    apply_pragmas(conn)
    return conn


def async_engine(path: str) -> AsyncEngine:
    """aiosqlite on the same file, for the SDK's session code and the migrations."""
    engine = create_async_engine(
        URL.create("sqlite+aiosqlite", database=path), connect_args={"timeout": BUSY_TIMEOUT_S}
    )
    event.listen(engine.sync_engine, "connect", apply_pragmas)
    return engine


def pin_busy_timeout(engine: AsyncEngine) -> None:
    """Re-assert the busy timeout after other libraries added connect listeners.

    The SDK's SQLAlchemySession registers its own listener (busy_timeout=5000) on first use;
    connect listeners run in registration order, so this one, added after it, has the last word.
    """
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", apply_pragmas)


def file_path(url: URL) -> str:
    """The database file of a SQLite URL, its folder created; refuses in-memory databases,
    which the store's several connections could not share."""
    database = url.database or ""
    if (
        not database
        or database == ":memory:"
        or database.startswith("file:")
        or (url.query.get("mode") == "memory")
    ):
        from persistence.store import DatabaseConfigError

        raise DatabaseConfigError(
            "the gateway needs a SQLite file (sqlite:///path/to/gateway.db), not an in-memory "
            "database: its connections could not share one"
        )
    path = Path(database).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)
