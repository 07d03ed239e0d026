"""Connections to a SQLite file, all with the same pragmas.

WAL with `synchronous=NORMAL` keeps every committed transaction durable across a process crash
(the gateway's crash model) while readers run beside the single writer.

A URL with `?mode=ro` (the operator's read commands) opens the file read-only, as SQLite's own
`mode=ro` does: nothing is created or changed, not even the journal mode (switching a file to
WAL writes to it), so a file that is refused is left exactly as it was, and a file the process
may only read can be read.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any
from urllib.request import pathname2url

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
# The pragmas that change nothing in the file.
READ_ONLY_PRAGMAS = tuple(pragma for pragma in PRAGMAS if "journal_mode" not in pragma)


def apply_pragmas(dbapi_connection: Any, _record: Any = None) -> None:
    _apply(dbapi_connection, PRAGMAS)


def apply_read_only_pragmas(dbapi_connection: Any, _record: Any = None) -> None:
    _apply(dbapi_connection, READ_ONLY_PRAGMAS)


def _apply(dbapi_connection: Any, pragmas: tuple[str, ...]) -> None:
    cursor = dbapi_connection.cursor()
    try:
        for pragma in pragmas:
            cursor.execute(pragma)
    finally:
        cursor.close()


def read_only_uri(path: str) -> str:
    uri = f"file:{pathname2url(path)}?mode=ro"
    if not os.path.exists(f"{path}-shm") and not os.access(os.path.dirname(path), os.W_OK):
        # Readers of a WAL file need its -shm file, which nobody can create in this folder:
        # then nobody writes the database either, and it is read as a file that cannot change.
        uri += "&immutable=1"
    return uri


def open_connection(path: str, read_only: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (the store issues BEGIN IMMEDIATE / COMMIT itself), not
    bound to one thread: a lane uses it inline or on its own thread, never both at once."""
    conn = sqlite3.connect(
        read_only_uri(path) if read_only else path,
        timeout=BUSY_TIMEOUT_S,
        isolation_level=None,
        check_same_thread=False,
        uri=read_only,
    )
    _apply(conn, READ_ONLY_PRAGMAS if read_only else PRAGMAS)
    return conn


def async_engine(path: str, read_only: bool = False) -> AsyncEngine:
    """aiosqlite on the same file, for the SDK's session code and the migrations."""
    url = URL.create("sqlite+aiosqlite", database=path)
    if read_only:
        url = URL.create("sqlite+aiosqlite", database=read_only_uri(path), query={"uri": "true"})
    engine = create_async_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})
    listener = apply_read_only_pragmas if read_only else apply_pragmas
    event.listen(engine.sync_engine, "connect", listener)
    return engine


def is_read_only(url: URL) -> bool:
    return url.query.get("mode") == "ro"


def pin_busy_timeout(engine: AsyncEngine) -> None:
    """Re-assert the busy timeout after other libraries added connect listeners.

    The SDK's SQLAlchemySession registers its own listener (busy_timeout=5000) on first use;
    connect listeners run in registration order, so this one, added after it, has the last word.
    """
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", apply_pragmas)


def file_path(url: URL) -> str:
    """The database file of a SQLite URL, its folder created; refuses in-memory databases,
    which the store's several connections could not share (read-only: the folder is not
    created)."""
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
    if not is_read_only(url):
        path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)
