"""A connection used on the event loop's own thread whenever it can be, else on a thread.

SQLite's work for the gateway is tens of microseconds for a read and well under a millisecond
for a batch of events. Handing each to a thread costs more than that, and far more under load:
`sqlite3` releases the GIL around every statement and every row it steps, and while the event
loop is busy, each time the thread wants the GIL back it waits out the interpreter's switch
interval (5 ms). Measured with 200 runs streaming, transactions of 0.7 ms of CPU took 5-800 ms
of wall time on their thread, and the delivery lag grew to seconds.

So a lane runs its work right on the calling (event loop) thread, with SQLite's busy handler
off, unless its thread is already busy with earlier work (one connection is never used by two
threads at once), the work is marked slow, or SQLite reports the database locked (a write lock
held by another connection or process). Only then does the work go to the lane's thread, which
waits for the lock the way SQLite's busy timeout would, without holding up the loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from gateway.protocol.error_codes import CodedError
from persistence.sqlite.connect import BUSY_TIMEOUT_S

T = TypeVar("T")


class LockBusy(CodedError):
    """The database is locked by another connection, and the caller chose not to wait."""


def is_busy(exc: OperationalError) -> bool:
    orig = exc.orig
    # The primary result code, so the extended ones (SQLITE_BUSY_RECOVERY, ...) count too.
    return isinstance(orig, sqlite3.OperationalError) and (
        (getattr(orig, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY
    )


def busy_retry(call: Callable[[], T], wait: bool, timeout_s: float = BUSY_TIMEOUT_S) -> T:
    """`call()`; if SQLite reports the database locked: `LockBusy` at once without `wait`,
    else try again with growing pauses until `timeout_s` has passed (then the error stands).

    Only for calls that did nothing before the lock was refused: a read, or `BEGIN IMMEDIATE`.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        try:
            return call()
        except OperationalError as exc:
            if not is_busy(exc):
                raise
            if not wait:
                raise LockBusy from exc
            if time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class Lane:
    """One connection of `engine`, checked out for the lane's life, and a thread of its own."""

    def __init__(self, name: str, engine: Engine, *, setup: str | None = None) -> None:
        self._engine = engine
        self._setup = setup  # a statement run on each new connection of the lane
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._conn: Connection | None = None
        # Work handed to the thread and not finished: while any is, nothing runs inline.
        self._in_thread = 0

    def connection(self) -> Connection:
        """The lane's connection, opened on first use (again after `reset`)."""
        if self._conn is None:
            conn = self._engine.connect()
            # `busy_retry` waits, and only on the thread.
            conn.exec_driver_sql("PRAGMA busy_timeout=0")
            if self._setup is not None:
                conn.exec_driver_sql(self._setup)
            self._conn = conn
        return self._conn

    def reset(self) -> None:
        """Drop the connection (after an error that may have left it unusable)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.invalidate()
                conn.close()
            except Exception:  # it is being thrown away: nothing more to do with it
                pass

    async def run(self, work: Callable[[bool], T], *, inline: bool = True) -> T:
        """`work(wait)`: inline with `wait=False` if allowed and the lane is free; on
        `LockBusy` (or while the thread is busy, or for work that may not run inline) on the
        thread with `wait=True`."""
        if inline and not self._in_thread:
            try:
                return work(False)
            except LockBusy:
                pass
        self._in_thread += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work, True)
        finally:
            self._in_thread -= 1

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self.reset)
        self._executor.shutdown(wait=True)
