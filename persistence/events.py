"""The per-thread event log table.

`seq` is assigned inside the writing transaction by bumping `threads.head_seq`, so the sequence
stays dense and unique even if more than one process ever writes to the same database.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import NamedTuple, TypeVar

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import transaction
from persistence.direct import Codecs, Direct
from persistence.errors import StorageUnavailable
from persistence.leases import Lease, LeaseLost, held_of
from persistence.slices import slices
from persistence.sqlite_lane import BUSY_TIMEOUT_S, Lane, busy_retry
from persistence.tables import events, threads

T = TypeVar("T")

log = logging.getLogger(__name__)

# WAL checkpoints run on a connection and thread of their own, at most this often, after a write.
# Left to SQLite, the commit that takes the WAL past 1000 pages runs the checkpoint itself
# (copying the pages back and syncing the file): here that would be the event log's writer, which
# every commit, session append and streamed event waits for, stalled for the length of an fsync
# (a few ms, hundreds on a busy disk).
CHECKPOINT_EVERY_S = 1.0
# The writer still checkpoints by itself past this many pages, so the WAL stays bounded should
# the background checkpoints never get through (a reader holding an old snapshot, say).
WRITER_AUTOCHECKPOINT_PAGES = 10_000

# Named tuples rather than frozen dataclasses: one of each is made for every event streamed or
# replayed, and a frozen dataclass's __init__ (object.__setattr__ per field) costs several
# times as much. Both are just as immutable.


class NewEvent(NamedTuple):
    thread_id: str
    run_id: str | None
    type: str
    ts: str
    data: str  # compact JSON text
    # The run lease the writer held when producing the event; stored only if still current.
    lease: Lease | None = None


class EventRecord(NamedTuple):
    thread_id: str
    seq: int
    run_id: str | None
    type: str
    ts: str
    data: str


# Threads whose heads one statement bumps (two bound values each).
HEADS_PER_STATEMENT = 400
# Up to this many threads in a batch, each head is bumped by its own short UPDATE: SQLite runs
# `UPDATE ... FROM (VALUES ...)` through a temporary table, a fixed ~80 µs that single-row
# updates (~15-20 µs each) only match at about five threads (measured on the events schema).
FEW_THREADS = 4


class ThreadMissing(LookupError):
    pass


class EventRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def append_batch(self, batch: Sequence[NewEvent]) -> list[EventRecord]:
        """Store a batch in one transaction; returns the records with their seq, in order."""
        async with transaction(self._engine) as conn:
            return await self.append_in(conn, batch)

    @staticmethod
    async def append_in(conn: AsyncConnection, batch: Sequence[NewEvent]) -> list[EventRecord]:
        counts: dict[str, int] = {}
        for item in batch:
            counts[item.thread_id] = counts.get(item.thread_id, 0) + 1
        next_seq: dict[str, int] = {}
        for thread_id, count in counts.items():
            head = (
                await conn.execute(
                    update(threads)
                    .where(threads.c.thread_id == thread_id)
                    .values(head_seq=threads.c.head_seq + count)
                    .returning(threads.c.head_seq)
                )
            ).scalar_one_or_none()
            if head is None:
                raise ThreadMissing(thread_id)
            next_seq[thread_id] = int(head) - count + 1
        records: list[EventRecord] = []
        for item in batch:
            seq = next_seq[item.thread_id]
            next_seq[item.thread_id] = seq + 1
            records.append(
                EventRecord(item.thread_id, seq, item.run_id, item.type, item.ts, item.data)
            )
        await conn.execute(
            events.insert(),
            [
                {
                    "thread_id": r.thread_id,
                    "seq": r.seq,
                    "run_id": r.run_id,
                    "type": r.type,
                    "ts": r.ts,
                    "data": r.data,
                }
                for r in records
            ],
        )
        return records

    async def read(self, thread_id: str, *, after_seq: int, limit: int) -> list[EventRecord]:
        query = (
            select(
                events.c.thread_id,
                events.c.seq,
                events.c.run_id,
                events.c.type,
                events.c.ts,
                events.c.data,
            )
            .where(events.c.thread_id == thread_id, events.c.seq > after_seq)
            .order_by(events.c.seq)
            .limit(limit)
        )
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).all()
        return [EventRecord(*row) for row in rows]

    async def for_run(self, thread_id: str, run_id: str, types: Sequence[str]) -> list[EventRecord]:
        """The run's events of `types`, through the primary key: a run's events are all in
        its thread (the log has no index by run)."""
        query = (
            select(
                events.c.thread_id,
                events.c.seq,
                events.c.run_id,
                events.c.type,
                events.c.ts,
                events.c.data,
            )
            .where(
                events.c.thread_id == thread_id,
                events.c.run_id == run_id,
                events.c.type.in_(list(types)),
            )
            .order_by(events.c.seq)
        )
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).all()
        return [EventRecord(*row) for row in rows]


def direct_store(store: SqliteEventStore | None) -> SqliteEventStore | None:
    """`store` when the direct path may be used right now, else None (use the engine)."""
    return store if store is not None and store.usable() else None


class SqliteEventStore:
    """The direct path to a SQLite file: its own `sqlite3` connections, each a `Lane`.

    Through SQLAlchemy's async engine every statement of a transaction is several round trips
    to aiosqlite's worker thread, plus SQLAlchemy's own work per statement, and both cost far
    more than SQLite's: about 3 ms for a batch of ten events against 0.4 ms here, and 4-5 ms
    for a pause (checkpoint, approvals, lease, events) against well under 1 ms, where the
    whole transaction is one call. Each lane runs its work on the event loop's thread when it
    can, else on its own thread (persistence/sqlite_lane.py says why and when).

    - `append` group-commits streamed events, with the SQL and guarantees of
      `EventRepository.append_in` and `LeaseRepository.fence_in`: `BEGIN IMMEDIATE` takes the
      write lock first, `seq` comes from bumping `threads.head_seq` in the same transaction,
      and an event is stored only while its run's lease is the current one.
    - `commit` is an atomic commit (the event log's `commit`): the leases are fenced, a
      repository's direct statements run (`work`), the events are stored, all in one
      transaction on the same connection as `append`, so the log's order holds.
    - `read` reads replay pages (plain tuples instead of SQLAlchemy rows) on a second
      connection, so a long replay never holds up the next commit (WAL lets both run at once);
      `query` runs the repositories' direct reads on a third, so a decision's reads never wait
      behind a replay page.

    `usable()` is False while anything observes the engine's statements (SQL tracing, the
    tests' storage faults): callers then use the engine, where those observers see them.
    """

    def __init__(self, path: str, engine: AsyncEngine) -> None:
        self._path = path
        self._dispatch = engine.sync_engine.dispatch
        self._codecs = Codecs(engine.dialect)
        # A connection each, used on the event loop's thread whenever it can be
        # (persistence/sqlite_lane.py): a replay never holds up the next commit (WAL lets
        # both run at once), and a decision's reads never wait behind a replay page.
        self._writes = Lane("event-appender", self._open_writer)
        self._reads = Lane("event-reader", self._open)
        self._queries = Lane("store-reader", self._open)
        # Always on a thread of its own: it syncs the file.
        self._checkpointer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-checkpoint")
        self._checkpoint_conn: sqlite3.Connection | None = None
        # Written by whichever thread runs the writes (`_checkpointing` is cleared by the
        # checkpointer).
        self._checkpoint_due = 0.0
        self._checkpointing = False

    @classmethod
    def for_engine(cls, engine: AsyncEngine) -> SqliteEventStore | None:
        """An appender for a SQLite file database; None for anything else (memory, other
        backends), which keep the SQLAlchemy path."""
        url = engine.url
        database = url.database or ""
        if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
            return None
        if database.startswith("file:") or url.query.get("mode") == "memory":
            return None
        return cls(str(Path(database).expanduser().resolve()), engine)

    def usable(self) -> bool:
        # Statement-level observers (SQL tracing, the tests' storage faults) hook SQLAlchemy's
        # cursor events: while any is installed, every statement stays where they can see it.
        dispatch = self._dispatch
        return not (dispatch.before_cursor_execute or dispatch.after_cursor_execute)

    async def append(
        self, batch: Sequence[NewEvent], leases: set[Lease]
    ) -> tuple[list[EventRecord], set[Lease]]:
        """One transaction: fence each lease, store the events whose lease holds.

        Returns the stored records (in batch order) and the leases that were lost.
        """
        return await self._writes.run(partial(self._append, list(batch), leases))

    async def commit(
        self, batch: Sequence[NewEvent], work: Callable[[Direct], T] | None
    ) -> tuple[T | None, list[EventRecord]]:
        """One transaction: every lease of `batch` must hold (else `LeaseLost` and nothing is
        stored), then `work`, then the events. Returns `work`'s result and the records.

        An exception from `work` rolls everything back and reaches the caller unchanged;
        an integrity error surfaces as SQLAlchemy's `IntegrityError`, as on the engine.
        """
        return await self._writes.run(partial(self._commit, list(batch), work))

    async def read(self, thread_id: str, *, after_seq: int, limit: int) -> list[EventRecord]:
        """Events of a thread after `after_seq`, in order, at most `limit` (as
        `EventRepository.read`)."""
        return await self._reads.run(partial(self._read, thread_id, after_seq, limit))

    async def query(self, work: Callable[[Direct], T]) -> T:
        """Run a repository's direct read (autocommit: each statement sees the newest commit)."""
        return await self._queries.run(partial(self._query, work))

    async def close(self) -> None:
        await self._writes.close()
        await self._reads.close()
        await self._queries.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._checkpointer, self._close_checkpointer)
        self._checkpointer.shutdown(wait=True)

    def _open(self) -> sqlite3.Connection:
        # Not bound to one thread: a lane uses it inline or on its thread, never both at once.
        conn = sqlite3.connect(
            self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        # The same pragmas as the engine's connections (persistence/db.py).
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _open_writer(self) -> sqlite3.Connection:
        conn = self._open()
        conn.execute(f"PRAGMA wal_autocheckpoint={WRITER_AUTOCHECKPOINT_PAGES}")
        return conn

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
                self._checkpoint_conn = self._open()
            # PASSIVE: copies what it can without waiting for (or blocking) readers and writers.
            self._checkpoint_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            # Best effort: the next one tries again, and the writer's own limit still holds.
            log.warning("WAL checkpoint failed", exc_info=True)
            self._close_checkpointer()
        finally:
            self._checkpointing = False

    def _read(self, thread_id: str, after_seq: int, limit: int, wait: bool) -> list[EventRecord]:
        try:
            conn = self._reads.connection()
            rows = busy_retry(
                lambda: conn.execute(
                    "SELECT thread_id, seq, run_id, type, ts, data FROM events"
                    " WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    (thread_id, after_seq, limit),
                ).fetchall(),
                wait,
            )
        except sqlite3.Error as exc:
            self._reads.reset()
            raise StorageUnavailable(f"storage unavailable: {type(exc).__name__}") from exc
        return list(map(EventRecord._make, rows))

    def _query(self, work: Callable[[Direct], T], wait: bool) -> T:
        try:
            db = Direct(self._queries.connection(), self._codecs)
            return busy_retry(lambda: work(db), wait)
        except sqlite3.Error as exc:
            self._queries.reset()
            raise StorageUnavailable(f"storage unavailable: {type(exc).__name__}") from exc

    def _append(
        self, batch: list[NewEvent], leases: set[Lease], wait: bool
    ) -> tuple[list[EventRecord], set[Lease]]:
        def fenced(conn: sqlite3.Connection) -> tuple[list[EventRecord], set[Lease]]:
            lost = leases - held_of(conn, list(leases)) if leases else set()
            kept = [e for e in batch if e.lease not in lost] if lost else batch
            return _store(conn, kept), lost

        try:
            return self._transaction(fenced, wait)
        except sqlite3.IntegrityError:
            raise  # a programming or race signal, not an outage (as `transaction`)

    def _commit(
        self, batch: list[NewEvent], work: Callable[[Direct], T] | None, wait: bool
    ) -> tuple[T | None, list[EventRecord]]:
        def atomic(conn: sqlite3.Connection) -> tuple[T | None, list[EventRecord]]:
            leases = {e.lease for e in batch if e.lease is not None}
            lost = leases - held_of(conn, list(leases))
            if lost:
                raise LeaseLost(next(iter(lost)).run_id)
            result = work(Direct(conn, self._codecs)) if work is not None else None
            return result, _store(conn, batch) if batch else []

        try:
            return self._transaction(atomic, wait)
        except sqlite3.IntegrityError as exc:
            # What the engine raises for the same statement, so callers handle one type.
            raise IntegrityError(None, None, exc) from exc

    def _transaction(self, body: Callable[[sqlite3.Connection], T], wait: bool) -> T:
        """`body` in one write transaction. Without `wait`, `LockBusy` if another connection
        holds the write lock (nothing done); with it, wait for the lock up to the busy timeout.
        """
        try:
            conn = self._writes.connection()
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"storage unavailable: {type(exc).__name__}") from exc
        try:
            busy_retry(lambda: conn.execute("BEGIN IMMEDIATE"), wait)
            try:
                result = body(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            self._maybe_checkpoint()
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            # A connection that failed mid-transaction may be unusable: open a fresh one.
            self._writes.reset()
            raise StorageUnavailable(f"storage unavailable: {type(exc).__name__}") from exc
        return result


def _store(conn: sqlite3.Connection, batch: list[NewEvent]) -> list[EventRecord]:
    counts: dict[str, int] = {}
    for item in batch:
        counts[item.thread_id] = counts.get(item.thread_id, 0) + 1
    heads = _bump_heads(conn, counts)
    next_seq = {thread_id: head - counts[thread_id] + 1 for thread_id, head in heads.items()}
    if len(next_seq) != len(counts):
        raise ThreadMissing(next(t for t in counts if t not in next_seq))
    records: list[EventRecord] = []
    for item in batch:
        seq = next_seq[item.thread_id]
        next_seq[item.thread_id] = seq + 1
        records.append(EventRecord(item.thread_id, seq, item.run_id, item.type, item.ts, item.data))
    conn.executemany(
        "INSERT INTO events (thread_id, seq, run_id, type, ts, data) VALUES (?, ?, ?, ?, ?, ?)",
        [(r.thread_id, r.seq, r.run_id, r.type, r.ts, r.data) for r in records],
    )
    return records


def _bump_heads(conn: sqlite3.Connection, counts: dict[str, int]) -> dict[str, int]:
    """Add each thread's count of new events to its head; the new heads (a missing thread is
    absent). The statements run to completion (fetchall) before the transaction commits."""
    threads_ = list(counts.items())
    if len(threads_) <= FEW_THREADS:
        heads: dict[str, int] = {}
        for thread_id, n in threads_:
            rows = conn.execute(
                "UPDATE threads SET head_seq = head_seq + ? WHERE thread_id = ? RETURNING head_seq",
                (n, thread_id),
            ).fetchall()
            if rows:
                heads[thread_id] = int(rows[0][0])
        return heads
    heads = {}
    for chunk in slices(threads_, HEADS_PER_STATEMENT):
        values = ", ".join("(?, ?)" for _ in chunk)
        rows = conn.execute(
            f"WITH added(thread_id, n) AS (VALUES {values})"
            " UPDATE threads SET head_seq = head_seq + added.n FROM added"
            " WHERE threads.thread_id = added.thread_id"
            " RETURNING threads.thread_id, threads.head_seq",
            [value for pair in chunk for value in pair],
        ).fetchall()
        heads.update((thread_id, int(head)) for thread_id, head in rows)
    return heads
