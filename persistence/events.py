"""The per-thread event log table.

`seq` is assigned inside the writing transaction by bumping `threads.head_seq`, so the sequence
stays dense and unique even if more than one process ever writes to the same database.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from persistence.db import transaction
from persistence.errors import StorageUnavailable
from persistence.leases import Lease
from persistence.tables import events, threads

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

    async def for_run(self, run_id: str, types: Sequence[str]) -> list[EventRecord]:
        query = (
            select(
                events.c.thread_id,
                events.c.seq,
                events.c.run_id,
                events.c.type,
                events.c.ts,
                events.c.data,
            )
            .where(events.c.run_id == run_id, events.c.type.in_(list(types)))
            .order_by(events.c.seq)
        )
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).all()
        return [EventRecord(*row) for row in rows]


class SqliteEventStore:
    """Appends and reads events of a SQLite file on its own `sqlite3` connections and threads.

    Through SQLAlchemy's async engine every statement of a batch (lease fence, `head_seq` bump,
    insert, commit) is several round trips to aiosqlite's worker thread, and those hand-offs
    cost far more than SQLite's own work: about 3 ms for a batch of ten events against 0.4 ms
    here, where the whole transaction runs in one hop. The SQL and its guarantees are those of
    `EventRepository.append_in` and `LeaseRepository.fence_in`: `BEGIN IMMEDIATE` takes the
    write lock first, `seq` comes from bumping `threads.head_seq` in the same transaction, and
    an event is stored only while its run's lease is the current one. Replays read pages the
    same way (one hop per page, plain tuples instead of SQLAlchemy rows) on a second connection
    and thread, so a long replay never holds up the next commit (WAL lets both run at once).
    """

    def __init__(self, path: str) -> None:
        self._path = path
        # One thread per connection, so each is only ever used by the thread that opened it.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="event-appender")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="event-reader")
        self._conn: sqlite3.Connection | None = None
        self._read_conn: sqlite3.Connection | None = None

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
        return cls(str(Path(database).expanduser().resolve()))

    async def append(
        self, batch: Sequence[NewEvent], leases: set[Lease]
    ) -> tuple[list[EventRecord], set[Lease]]:
        """One transaction: fence each lease, store the events whose lease holds.

        Returns the stored records (in batch order) and the leases that were lost.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._append, list(batch), leases)

    async def read(self, thread_id: str, *, after_seq: int, limit: int) -> list[EventRecord]:
        """Events of a thread after `after_seq`, in order, at most `limit` (as
        `EventRepository.read`)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, self._read, thread_id, after_seq, limit)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close)
        await loop.run_in_executor(self._reader, self._close_reader)
        self._executor.shutdown(wait=True)
        self._reader.shutdown(wait=True)

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, timeout=30, isolation_level=None)
        # The same pragmas as the engine's connections (persistence/db.py).
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _close_reader(self) -> None:
        if self._read_conn is not None:
            self._read_conn.close()
            self._read_conn = None

    def _read(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        try:
            if self._read_conn is None:
                self._read_conn = self._open()
            rows = self._read_conn.execute(
                "SELECT thread_id, seq, run_id, type, ts, data FROM events"
                " WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (thread_id, after_seq, limit),
            ).fetchall()
        except sqlite3.Error as exc:
            self._close_reader()
            raise StorageUnavailable(f"storage unavailable: {type(exc).__name__}") from exc
        return list(map(EventRecord._make, rows))

    def _append(
        self, batch: list[NewEvent], leases: set[Lease]
    ) -> tuple[list[EventRecord], set[Lease]]:
        try:
            conn = self._connection()
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"storage unavailable: {type(exc).__name__}") from exc
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                lost = {lease for lease in leases if not _fence(conn, lease)}
                kept = [e for e in batch if e.lease not in lost] if lost else batch
                records = _store(conn, kept)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.IntegrityError:
            raise  # a programming or race signal, not an outage (as `transaction`)
        except sqlite3.Error as exc:
            # A connection that failed mid-transaction may be unusable: open a fresh one.
            self._close()
            raise StorageUnavailable(f"storage unavailable: {type(exc).__name__}") from exc
        return records, lost


def _fence(conn: sqlite3.Connection, lease: Lease) -> bool:
    # An UPDATE, like LeaseRepository.fence_in, so the check and the append are one write.
    cursor = conn.execute(
        "UPDATE runs SET lease_owner = ? WHERE run_id = ? AND lease_owner = ? AND lease_token = ?",
        (lease.owner, lease.run_id, lease.owner, lease.token),
    )
    return cursor.rowcount == 1


def _store(conn: sqlite3.Connection, batch: list[NewEvent]) -> list[EventRecord]:
    counts: dict[str, int] = {}
    for item in batch:
        counts[item.thread_id] = counts.get(item.thread_id, 0) + 1
    next_seq: dict[str, int] = {}
    for thread_id, count in counts.items():
        # fetchall: the statement must run to completion before the transaction commits.
        rows = conn.execute(
            "UPDATE threads SET head_seq = head_seq + ? WHERE thread_id = ? RETURNING head_seq",
            (count, thread_id),
        ).fetchall()
        if not rows:
            raise ThreadMissing(thread_id)
        next_seq[thread_id] = int(rows[0][0]) - count + 1
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
