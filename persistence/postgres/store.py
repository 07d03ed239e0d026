"""The Store on PostgreSQL, through asyncpg.

Each write is one transaction on a pooled connection; the repositories' synchronous functions
run inside it in a greenlet (SQLAlchemy's `greenlet_spawn`, which turns each statement into an
await on asyncpg), so they are the same functions, with the same statements, as on SQLite.
Concurrency is PostgreSQL's own: rows are locked by the statements that change them, fencing
reads lock the runs they check (`FOR SHARE`), and every statement that locks several rows of a
table does so in key order, so transactions over overlapping threads or runs never deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from persistence.store import DatabaseConfigError, Store, Work, storage_errors

T = TypeVar("T")

INSTALL_HINT = "pip install 'agents-ws-gateway[postgres]' (or: pip install asyncpg)"
# Connections per process: the lease keeper, decisions, run starts and reads.
POOL_SIZE = 10
POOL_OVERFLOW = 10
# The event log's writer, one transaction at a time, on a connection of its own: sharing the
# pool, every streamed event's commit queued behind the reads of 200 runs starting at once
# (150 ms a checkout at the median, 740 at most, figure 7 of docs/benchmarks.md). The overflow
# replaces it while a failed one is being closed.
LOG_POOL_SIZE = 1
LOG_POOL_OVERFLOW = 1


def _refuse_unusable(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled connection that cannot serve a fresh transaction is replaced at checkout
    (SQLAlchemy closes it and opens another), from what asyncpg knows without a round trip:

    - The server closed it (a restart, an idle timeout): the loop has read the socket's end.
      SQLAlchemy's `pool_pre_ping` would ask the server instead, three round trips (its ping
      is a transaction of its own) before every transaction, doubling those of a short one; a
      connection that dies without the socket saying so fails its transaction with
      `StorageUnavailable`, which every caller treats as retryable, and is replaced then.
    - It is still inside a transaction (`_close_hidden_transaction` closes such a connection
      as it returns; this is the check that nothing else left one)."""
    driver = dbapi_connection.driver_connection
    if driver.is_closed():
        raise DisconnectionError("the server closed this connection")
    if _hidden_transaction(dbapi_connection):
        raise DisconnectionError("this connection was left inside a transaction")


def _hidden_transaction(dbapi_connection: Any) -> bool:
    """Whether asyncpg is inside a transaction SQLAlchemy's adapter does not know of."""
    driver = dbapi_connection.driver_connection
    return dbapi_connection._transaction is None and (
        driver._top_xact is not None or driver.is_in_transaction()
    )


def _close_hidden_transaction(dbapi_connection: Any, _record: Any, _state: Any) -> None:
    """As a connection returns to the pool: a task cancelled while asyncpg sent a
    transaction's `BEGIN` leaves asyncpg holding that transaction while SQLAlchemy never
    learnt of it, so the rollback on return does nothing. Kept, every later transaction on the
    connection would be a savepoint inside that one, and the row locks it took (a fencing
    read's `FOR SHARE` on a run) would stay held, stalling other processes' writes to those
    rows while it idles in the pool. Closed instead, the server rolls it back at once and
    releases them; the pool replaces it at its next checkout (`_refuse_unusable`)."""
    if not dbapi_connection.driver_connection.is_closed() and _hidden_transaction(dbapi_connection):
        dbapi_connection.driver_connection.terminate()


def _checked_out(engine: Engine, work: Work[T], transaction: bool, opened: list[Connection]) -> T:
    """`work` on a connection of `engine` checked out for it (in a transaction if asked),
    inside the caller's greenlet. The connection is in `opened` while it is out: a failure
    leaves it there for the caller to close."""
    conn = engine.connect()
    opened.append(conn)
    if transaction:
        conn.begin()
        result = work(conn)
        conn.commit()
    else:
        result = work(conn)
    opened.clear()
    conn.close()
    return result


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
        # Reads and single-statement writes run each statement on its own (PostgreSQL's
        # autocommit), without a BEGIN and a COMMIT or ROLLBACK around it: two round trips
        # fewer, and no transaction to leave behind. Reads lose nothing by it: under READ
        # COMMITTED, the isolation every transaction here runs at, each statement of a
        # transaction sees its own snapshot anyway, and the locking reads (fencing, claims)
        # are all inside writes.
        self._autocommit = self._engine.execution_options(isolation_level="AUTOCOMMIT")
        self._log_engine = create_async_engine(
            url, pool_size=LOG_POOL_SIZE, max_overflow=LOG_POOL_OVERFLOW
        )
        self._log_autocommit = self._log_engine.execution_options(isolation_level="AUTOCOMMIT")
        for engine in (self._engine, self._log_engine):
            event.listen(engine.sync_engine, "checkout", _refuse_unusable)
            event.listen(engine.sync_engine, "reset", _close_hidden_transaction)

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    def statement_engines(self) -> Sequence[Engine]:
        return (self._engine.sync_engine, self._log_engine.sync_engine)

    async def write(
        self,
        work: Work[T],
        *,
        slow: bool = False,
        single_statement: bool = False,
        log_writer: bool = False,
    ) -> T:
        engine, autocommit = (
            (self._log_engine, self._log_autocommit)
            if log_writer
            else (self._engine, self._autocommit)
        )
        # A single statement is atomic on its own, committed as it completes.
        if single_statement:
            return await self._run(autocommit, work, transaction=False)
        return await self._run(engine, work, transaction=True)

    async def read(self, work: Work[T], *, bulk: bool = False) -> T:
        return await self._run(self._autocommit, work, transaction=False)

    async def _run(self, engine: AsyncEngine, work: Work[T], *, transaction: bool) -> T:
        """`work` on a pooled connection of `engine`, in a transaction if asked.

        Checkout, `BEGIN`, `work`, `COMMIT` and the return to the pool run in one greenlet
        (`_checked_out`): through `AsyncConnection` each was a greenlet of its own, and the
        four more cost 40-140 µs of CPU a call (docs/benchmarks.md, "PostgreSQL"). After a
        failure or a cancellation, the connection still out is closed SQLAlchemy's way, in
        a task of its own that a cancellation cannot abandon halfway (it rolls back whatever
        is open); once `work` has succeeded and committed, nothing is left to roll back and
        the connection goes back to the pool without a round trip."""
        opened: list[Connection] = []
        with storage_errors():
            try:
                return await greenlet_spawn(
                    _checked_out, engine.sync_engine, work, transaction, opened
                )
            except BaseException as exc:
                if opened:
                    await AsyncConnection(engine, opened[0]).__aexit__(
                        type(exc), exc, exc.__traceback__
                    )
                raise

    async def close(self) -> None:
        await self._engine.dispose()
        await self._log_engine.dispose()
