"""The Store on a SQLite file: three lanes of synchronous SQLAlchemy connections.

Through SQLAlchemy's async engine every statement is a round trip to aiosqlite's worker thread,
several for a transaction, and under load each costs milliseconds (persistence/sqlite/lane.py
says why). Here a whole transaction or read is one call on a lane, run on the event loop's
thread whenever it can be:

- writes: one connection, `BEGIN IMMEDIATE` (the write lock is taken first, so a transaction
  never fails half way on a lock another process holds), the work, `COMMIT`. Every write of the
  process goes through it in turn: the event log's group commits, atomic commits, the SDK
  session's appends, leases, the ledger;
- bulk reads (replay pages) on a second connection, so a long replay never holds up the next
  commit (WAL lets both run at once);
- short reads (a decision's run and approval, a thread's head) on a third, so they never wait
  behind a replay page.

The statements are the repositories' Core statements, through one synchronous engine whose
events (`statement_engines`) see every one of them.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from persistence.prepared import run_sql
from persistence.sqlite.connect import async_engine, file_path, is_read_only, open_connection
from persistence.sqlite.lane import Lane, busy_retry
from persistence.store import Store, Work, storage_errors

T = TypeVar("T")

log = logging.getLogger(__name__)

# WAL checkpoints run on a connection and thread of their own, at most this often, after a write.
# Left to SQLite, the commit that takes the WAL past 1000 pages runs the checkpoint itself
# (copying the pages back and syncing the file): here that would be the writer lane, which
# every commit, session append and streamed event waits for, stalled for the length of an fsync
# (a few ms, hundreds on a busy disk).
CHECKPOINT_EVERY_S = 1.0
# The writer still checkpoints by itself past this many pages, so the WAL stays bounded should
# the background checkpoints never get through (a reader holding an old snapshot, say).
WRITER_AUTOCHECKPOINT_PAGES = 10_000


class SqliteStore(Store):
    def __init__(self, url: URL) -> None:
        super().__init__(url)
        self._path = file_path(url)
        # `?mode=ro`: nothing written, not even the journal mode (persistence/sqlite/connect.py).
        read_only = is_read_only(url)
        self._async_engine = async_engine(self._path, read_only)
        # One engine for the three lanes: each checks a connection out for its life.
        self._engine = create_engine(
            URL.create("sqlite", database=self._path),
            creator=partial(open_connection, self._path, read_only),
            isolation_level="AUTOCOMMIT",
            pool_size=3,
            max_overflow=3,
        )
        self._writes = Lane(
            "store-writer",
            self._engine,
            setup=f"PRAGMA wal_autocheckpoint={WRITER_AUTOCHECKPOINT_PAGES}",
        )
        self._bulk_reads = Lane("store-bulk-reader", self._engine)
        self._reads = Lane("store-reader", self._engine)
        # Always on a thread of its own: it syncs the file.
        self._checkpointer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-checkpoint")
        self._checkpoint_conn: sqlite3.Connection | None = None
        # Written by whichever thread runs the writes (`_checkpointing` is cleared by the
        # checkpointer).
        self._checkpoint_due = 0.0
        self._checkpointing = False
        # Whether the last checkpoint failed: a failure is logged when a streak starts, not
        # every second while the disk stays full.
        self._checkpoint_failing = False

    @property
    def engine(self) -> AsyncEngine:
        return self._async_engine

    def statement_engines(self) -> Sequence[Engine]:
        return (self._engine,)

    async def write(
        self,
        work: Work[T],
        *,
        slow: bool = False,
        single_statement: bool = False,
        log_writer: bool = False,
    ) -> T:
        # One statement or several, SQLite's single writer takes the same path: its
        # transaction control costs no round trip. Every write, the log's included, has
        # that writer's connection, which waits for no reader.
        return await self._writes.run(partial(self._transaction, work), inline=not slow)

    async def read(self, work: Work[T], *, bulk: bool = False) -> T:
        lane = self._bulk_reads if bulk else self._reads
        return await lane.run(partial(self._read, lane, work))

    async def close(self) -> None:
        await self._writes.close()
        await self._bulk_reads.close()
        await self._reads.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._checkpointer, self._close_checkpointer)
        self._checkpointer.shutdown(wait=True)
        self._engine.dispose()
        await self._async_engine.dispose()

    def _read(self, lane: Lane, work: Work[T], wait: bool) -> T:
        with storage_errors(), _reset_on_failure(lane):
            conn = lane.connection()
            return busy_retry(lambda: work(conn), wait)

    def _transaction(self, work: Work[T], wait: bool) -> T:
        """`work` in one write transaction. Without `wait`, `LockBusy` if another connection
        holds the write lock (nothing done); with it, wait for the lock up to the busy timeout.
        """
        with storage_errors(), _reset_on_failure(self._writes):
            conn = self._writes.connection()
            busy_retry(lambda: run_sql(conn, "BEGIN IMMEDIATE"), wait)
            try:
                result = work(conn)
                run_sql(conn, "COMMIT")
            except BaseException:
                _rollback(conn)
                raise
        self._maybe_checkpoint()
        return result

    def _close_checkpointer(self) -> None:
        if self._checkpoint_conn is not None:
            self._checkpoint_conn.close()
            self._checkpoint_conn = None

    def _maybe_checkpoint(self) -> None:
        """After a commit: start a background checkpoint when one is due."""
        now = time.monotonic()
        if self._checkpointing or now < self._checkpoint_due:
            return
        self._checkpointing = True
        self._checkpoint_due = now + CHECKPOINT_EVERY_S
        self._checkpointer.submit(self._checkpoint)

    def _checkpoint(self) -> None:
        try:
            if self._checkpoint_conn is None:
                self._checkpoint_conn = open_connection(self._path)
            # PASSIVE: copies what it can without waiting for (or blocking) readers and writers.
            self._checkpoint_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            # Best effort: the next one tries again, and the writer's own limit still holds.
            # SQLite's message names the cause (a full disk, say), never a statement or row.
            if not self._checkpoint_failing:
                log.warning("WAL checkpoints fail (%s: %s); retrying", type(exc).__name__, exc)
            self._checkpoint_failing = True
            self._close_checkpointer()
        else:
            if self._checkpoint_failing:
                log.info("WAL checkpoints go through again")
            self._checkpoint_failing = False
        finally:
            self._checkpointing = False


@contextmanager
def _reset_on_failure(lane: Lane) -> Iterator[None]:
    """Around a lane's work: a database error other than an integrity error may have left the
    connection unusable, so the lane opens a fresh one next time."""
    try:
        yield
    except DBAPIError as exc:
        if not isinstance(exc, IntegrityError):
            lane.reset()
        raise


def _rollback(conn: Connection) -> None:
    dbapi = conn.connection.driver_connection
    if dbapi is not None and dbapi.in_transaction:
        run_sql(conn, "ROLLBACK")
