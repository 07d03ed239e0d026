"""The Store on PostgreSQL, through asyncpg.

Each write is one transaction on a pooled connection; the repositories' synchronous functions
run inside it through SQLAlchemy's `run_sync` (a greenlet that turns each statement into an
await on asyncpg), so they are the same functions, with the same statements, as on SQLite.
Concurrency is PostgreSQL's own: rows are locked by the statements that change them, fencing
reads lock the runs they check (`FOR SHARE`), and every statement that locks several rows of a
table does so in key order, so transactions over overlapping threads or runs never deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from persistence.store import DatabaseConfigError, Store, Work, storage_errors

T = TypeVar("T")

INSTALL_HINT = "pip install 'agents-ws-gateway[postgres]' (or: pip install asyncpg)"
# Connections per process: the event log's writer, the lease keeper, decisions and reads.
POOL_SIZE = 10
POOL_OVERFLOW = 10


def _refuse_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled connection that the server has closed (a restart, an idle timeout) is replaced
    at checkout. asyncpg knows it for free: the loop has read the server's end of the socket.
    SQLAlchemy's `pool_pre_ping` would ask the server instead, three round trips (its ping is
    a transaction of its own) before every transaction, doubling those of a short one; a
    connection that dies without the socket saying so fails its transaction with
    `StorageUnavailable`, which every caller treats as retryable, and is replaced then."""
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("the server closed this connection")


class PostgresStore(Store):
    def __init__(self, url: URL) -> None:
        driver = url.get_driver_name()
        if driver not in {"asyncpg", "psycopg2", "psycopg", "postgresql", "postgres"}:
            raise DatabaseConfigError(
                f"PostgreSQL runs through asyncpg here (got driver {driver!r}): "
                "use postgresql://user@host/dbname or postgresql+asyncpg://..."
            )
        try:
            import asyncpg  # noqa: F401
        except ModuleNotFoundError as exc:
            raise DatabaseConfigError(
                f"the PostgreSQL driver asyncpg is not installed: {INSTALL_HINT}"
            ) from exc
        url = url.set(drivername="postgresql+asyncpg")
        super().__init__(url)
        self._engine = create_async_engine(url, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)
        event.listen(self._engine.sync_engine, "checkout", _refuse_closed)

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    def statement_engines(self) -> Sequence[Engine]:
        return (self._engine.sync_engine,)

    async def write(self, work: Work[T], *, slow: bool = False) -> T:
        with storage_errors():
            async with self._engine.begin() as conn:
                return await conn.run_sync(work)

    async def read(self, work: Work[T], *, bulk: bool = False) -> T:
        with storage_errors():
            async with self._engine.connect() as conn:
                return await conn.run_sync(work)

    async def close(self) -> None:
        await self._engine.dispose()
