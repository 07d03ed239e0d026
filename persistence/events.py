"""The per-thread event log table.

`seq` is assigned inside the writing transaction by bumping `threads.head_seq`, so the sequence
stays dense and unique with any number of writers on one database. Heads are bumped in thread
id order: two PostgreSQL transactions over overlapping threads then lock those rows in the same
order and never deadlock (SQLite has one writer at a time anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from sqlalchemy import bindparam, select, text, update
from sqlalchemy.engine import Connection

from gateway.protocol.error_codes import CodedError
from persistence.leases import FencedBy, Lease, LeaseLost, lost_in
from persistence.prepared import Prepared, PreparedIn
from persistence.tables import events, threads

if TYPE_CHECKING:
    from persistence.store import Store

T = TypeVar("T")


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


# Called with the stored records inside their transaction, before it commits: whatever it
# writes (the webhook outbox, persistence/webhooks.py) commits or rolls back with them.
Announce = Callable[[Connection, list[EventRecord]], None]


class ThreadMissing(CodedError, LookupError):
    """A thread the batch appends to has no row (the message is its id)."""


# Up to this many threads in a batch, each head is bumped by its own UPDATE ... RETURNING;
# beyond, one locking read of all the heads and one executemany UPDATE cost less than a
# statement per thread.
FEW_THREADS = 4

_BUMP_ONE = Prepared(
    update(threads)
    .where(threads.c.thread_id == bindparam("b_thread"))
    .values(head_seq=threads.c.head_seq + bindparam("b_count"))
    .returning(threads.c.head_seq)
)
_LOCK_HEADS = PreparedIn(
    "b_thread",
    lambda one_of: (
        select(threads.c.thread_id, threads.c.head_seq)
        .where(one_of.of(threads.c.thread_id))
        .order_by(threads.c.thread_id)
        .with_for_update()
    ),
)
_SET_HEAD = Prepared(
    update(threads)
    .where(threads.c.thread_id == bindparam("b_thread"))
    .values(head_seq=bindparam("b_head"))
)
_COLUMNS = (
    events.c.thread_id,
    events.c.seq,
    events.c.run_id,
    events.c.type,
    events.c.ts,
    events.c.data,
)
_INSERT = Prepared(events.insert(), keys=EventRecord._fields)
# PostgreSQL: a batch on one thread (a run's events, an atomic commit) bumps the head and
# inserts its rows in one statement, one round trip instead of two; the rows take the new
# head's last `b_count` seqs in batch order. A missing thread inserts nothing. SQLite's
# statements cost no round trip, so it keeps the two.
_APPEND_ON_ONE_THREAD = Prepared(
    text(
        "WITH head AS (UPDATE threads SET head_seq = threads.head_seq + :b_count"
        " WHERE threads.thread_id = :b_thread RETURNING threads.head_seq)"
        " INSERT INTO events (thread_id, seq, run_id, type, ts, data)"
        " SELECT :b_thread, head.head_seq - :b_count + e.n, e.run_id, e.type, e.ts, e.data"
        " FROM head, unnest(CAST(:b_runs AS VARCHAR[]), CAST(:b_types AS VARCHAR[]),"
        " CAST(:b_ts AS VARCHAR[]), CAST(:b_data AS TEXT[]))"
        " WITH ORDINALITY AS e(run_id, type, ts, data, n)"
        " RETURNING events.seq"
    )
)
_PAGE = Prepared(
    select(*_COLUMNS)
    .where(events.c.thread_id == bindparam("b_thread"), events.c.seq > bindparam("b_after"))
    .order_by(events.c.seq)
    .limit(bindparam("b_limit"))
)

_OF_RUN = (
    select(*_COLUMNS)
    .where(
        events.c.thread_id == bindparam("b_thread"),
        events.c.run_id == bindparam("b_run"),
        events.c.type.in_(bindparam("b_types", expanding=True)),
    )
    .order_by(events.c.seq)
)


# PostgreSQL: a batch of streamed events fenced and appended in one statement. `held`: the
# batch's leases as their runs' rows hold them now, locked against a takeover (FOR SHARE, in run
# id order); `kept`: the events whose lease holds; `heads`: their threads' heads, locked in
# thread id order (counted before any head moves, so every lock is taken first); `bumped`:
# each head advanced by its thread's count, only if every thread has a row (else nothing is
# bumped or stored); `numbered`: each kept event's seq, the thread's new head's last ones in
# batch order, the threads' old heads looked up in one JSON object (the planner cannot size
# these CTEs, and a join between two of them would be a nested loop over both). Returns
# (position, seq) of each stored event and (position, NULL) of each whose lease was lost.
_FENCED_APPEND = Prepared(
    text(
        """
WITH ev AS MATERIALIZED (
    SELECT * FROM unnest(
        CAST(:b_threads AS VARCHAR[]), CAST(:b_runs AS VARCHAR[]),
        CAST(:b_leased AS VARCHAR[]), CAST(:b_owners AS VARCHAR[]), CAST(:b_tokens AS BIGINT[]),
        CAST(:b_types AS VARCHAR[]), CAST(:b_ts AS VARCHAR[]), CAST(:b_data AS TEXT[])
    ) WITH ORDINALITY AS e(thread_id, run_id, leased, owner, token, type, ts, data, n)
),
held AS MATERIALIZED (
    SELECT runs.run_id, runs.lease_owner, runs.lease_token FROM runs
    WHERE runs.run_id IN (SELECT ev.leased FROM ev WHERE ev.leased IS NOT NULL)
    ORDER BY runs.run_id
    FOR SHARE
),
kept AS MATERIALIZED (
    SELECT ev.* FROM ev LEFT JOIN held ON held.run_id = ev.leased
    WHERE ev.leased IS NULL
        OR (held.lease_owner = ev.owner AND held.lease_token = ev.token)
),
counts AS MATERIALIZED (
    SELECT kept.thread_id, count(*) AS c FROM kept GROUP BY kept.thread_id
),
heads AS MATERIALIZED (
    SELECT threads.thread_id FROM threads
    WHERE threads.thread_id IN (SELECT counts.thread_id FROM counts)
    ORDER BY threads.thread_id
    FOR UPDATE
),
bumped AS (
    UPDATE threads SET head_seq = threads.head_seq + counts.c
    FROM counts
    WHERE threads.thread_id = counts.thread_id
        AND (SELECT count(*) FROM heads) = (SELECT count(*) FROM counts)
    RETURNING threads.thread_id, threads.head_seq - counts.c AS base
),
bases AS MATERIALIZED (
    SELECT jsonb_object_agg(bumped.thread_id, bumped.base) AS of_thread FROM bumped
),
numbered AS MATERIALIZED (
    SELECT kept.n, kept.thread_id, kept.run_id, kept.type, kept.ts, kept.data,
        CAST(bases.of_thread ->> kept.thread_id AS BIGINT)
            + row_number() OVER (PARTITION BY kept.thread_id ORDER BY kept.n) AS seq
    FROM kept, bases
    WHERE bases.of_thread IS NOT NULL
),
inserted AS (
    INSERT INTO events (thread_id, seq, run_id, type, ts, data)
    SELECT numbered.thread_id, numbered.seq, numbered.run_id, numbered.type, numbered.ts,
        numbered.data
    FROM numbered
)
SELECT numbered.n, numbered.seq FROM numbered
UNION ALL
SELECT ev.n, NULL FROM ev WHERE ev.n NOT IN (SELECT kept.n FROM kept)
"""
    )
)
_THREADS_FOUND = PreparedIn(
    "b_thread",
    lambda one_of: select(threads.c.thread_id).where(one_of.of(threads.c.thread_id)),
)


def append_in(conn: Connection, batch: Sequence[NewEvent]) -> list[EventRecord]:
    """Store `batch` inside the caller's transaction; the records with their seq, in order."""
    if not batch:
        return []
    counts: dict[str, int] = {}
    for item in batch:
        counts[item.thread_id] = counts.get(item.thread_id, 0) + 1
    if len(counts) == 1 and conn.dialect.name == "postgresql":
        return _append_on_one_thread(conn, batch)
    heads = _bump_heads(conn, counts)
    if len(heads) != len(counts):
        raise ThreadMissing(next(t for t in counts if t not in heads))
    next_seq = {thread_id: head - counts[thread_id] + 1 for thread_id, head in heads.items()}
    records: list[EventRecord] = []
    for item in batch:
        seq = next_seq[item.thread_id]
        next_seq[item.thread_id] = seq + 1
        records.append(EventRecord(item.thread_id, seq, item.run_id, item.type, item.ts, item.data))
    _INSERT.many_rows(conn, EventRecord._fields, records)
    return records


def append_fenced_in(
    conn: Connection, batch: Sequence[NewEvent], announce: Announce | None = None
) -> tuple[list[EventRecord], set[Lease]]:
    """Store the events whose lease is still current; the records and the leases found lost.
    On PostgreSQL without `announce`, one statement (`_append_fenced_at_once`)."""
    if announce is None and batch and conn.dialect.name == "postgresql":
        return _append_fenced_at_once(conn, batch)
    lost = lost_in(conn, leases_of(batch))
    kept = [e for e in batch if e.lease not in lost] if lost else batch
    records = append_in(conn, kept)
    if announce is not None and records:
        announce(conn, records)
    return records, lost


class WithEvents(NamedTuple):
    """What an atomic commit's work returns when it decides, in its transaction, to store
    more events after the commit's own: `result` is then the commit's result. The events carry
    no lease (the work fences whatever it writes itself). A decision that leaves nothing
    pending starts the continuation in its own transaction this way, and so stores
    `run.resumed` only when it did (gateway/run_lifecycle/decisions.py)."""

    result: object
    events: Sequence[NewEvent]


def commit_in(
    conn: Connection,
    batch: Sequence[NewEvent],
    work: Callable[[Connection], T] | None,
    announce: Announce | None = None,
) -> tuple[T | None, list[EventRecord]]:
    """Every lease of `batch` must hold (else `LeaseLost`), then `work`, then the events (and
    those the work added, `WithEvents`). A lease the work is fenced by (`FencedBy`) is left to
    the work."""
    leases = leases_of(batch)
    if isinstance(work, FencedBy):
        leases.discard(work.lease)
    lost = lost_in(conn, leases)
    if lost:
        raise LeaseLost(next(iter(lost)).run_id)
    result = work(conn) if work is not None else None
    if isinstance(result, WithEvents):
        if leases_of(result.events):
            raise ValueError("events added by an atomic commit's work carry no lease")
        batch = [*batch, *result.events]
        result = result.result  # type: ignore[assignment]
    records = append_in(conn, batch)
    if announce is not None and records:
        announce(conn, records)
    return result, records


def leases_of(batch: Sequence[NewEvent]) -> set[Lease]:
    return {e.lease for e in batch if e.lease is not None}


def read_in(conn: Connection, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
    rows = _PAGE.rows(conn, {"b_thread": thread_id, "b_after": after_seq, "b_limit": limit})
    return list(map(EventRecord._make, rows))


def _append_fenced_at_once(
    conn: Connection, batch: Sequence[NewEvent]
) -> tuple[list[EventRecord], set[Lease]]:
    """`append_fenced_in` as one statement (`_FENCED_APPEND`): one round trip, where the
    fencing read, the head bumps and the rows were three or more, each a turn of a busy event
    loop for the writer. The statement takes its locks in the same order as the statements it
    replaces (the runs' leases in run id order, then the heads in thread id order)."""
    leases = [item.lease for item in batch]
    rows = _FENCED_APPEND.rows(
        conn,
        {
            "b_threads": [item.thread_id for item in batch],
            "b_runs": [item.run_id for item in batch],
            "b_leased": [lease.run_id if lease is not None else None for lease in leases],
            "b_owners": [lease.owner if lease is not None else None for lease in leases],
            "b_tokens": [lease.token if lease is not None else None for lease in leases],
            "b_types": [item.type for item in batch],
            "b_ts": [item.ts for item in batch],
            "b_data": [item.data for item in batch],
        },
    )
    # (position in the batch from 1, seq): a stored event's seq, or None for a lost lease's.
    seqs = dict(rows)
    records: list[EventRecord] = []
    lost: set[Lease] = set()
    for position, item in enumerate(batch, 1):
        if position not in seqs:
            # Neither stored nor fenced off: a thread of the batch has no row, and then the
            # statement stored nothing at all.
            threads_found = set(_THREADS_FOUND.rows(conn, [e.thread_id for e in batch]))
            raise ThreadMissing(
                next(e.thread_id for e in batch if (e.thread_id,) not in threads_found)
            )
        seq = seqs[position]
        if seq is None:  # fenced off (an event without a lease always is kept)
            assert item.lease is not None
            lost.add(item.lease)
            continue
        records.append(EventRecord(item.thread_id, seq, item.run_id, item.type, item.ts, item.data))
    return records, lost


def _append_on_one_thread(conn: Connection, batch: Sequence[NewEvent]) -> list[EventRecord]:
    thread_id = batch[0].thread_id
    stored = _APPEND_ON_ONE_THREAD.rows(
        conn,
        {
            "b_thread": thread_id,
            "b_count": len(batch),
            "b_runs": [item.run_id for item in batch],
            "b_types": [item.type for item in batch],
            "b_ts": [item.ts for item in batch],
            "b_data": [item.data for item in batch],
        },
    )
    if not stored:
        raise ThreadMissing(thread_id)
    first = min(seq for (seq,) in stored)
    return [
        EventRecord(thread_id, first + n, item.run_id, item.type, item.ts, item.data)
        for n, item in enumerate(batch)
    ]


def _bump_heads(conn: Connection, counts: dict[str, int]) -> dict[str, int]:
    """Add each thread's count of new events to its head, in thread id order; the new heads (a
    missing thread is absent)."""
    ordered = sorted(counts.items())
    heads: dict[str, int] = {}
    if len(ordered) <= FEW_THREADS:
        for thread_id, n in ordered:
            bumped = _BUMP_ONE.rows(conn, {"b_thread": thread_id, "b_count": n})
            if bumped:
                heads[thread_id] = int(bumped[0][0])
        return heads
    current = dict(_LOCK_HEADS.rows(conn, [thread_id for thread_id, _ in ordered]))
    for thread_id, n in ordered:
        if thread_id in current:
            heads[thread_id] = int(current[thread_id]) + n
    _SET_HEAD.many_rows(conn, ("b_head", "b_thread"), [(h, t) for t, h in heads.items()])
    return heads


class EventRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def read(self, thread_id: str, *, after_seq: int, limit: int) -> list[EventRecord]:
        return await self._store.read_events(thread_id, after_seq=after_seq, limit=limit)

    async def for_run(self, thread_id: str, run_id: str, types: Sequence[str]) -> list[EventRecord]:
        """The run's events of `types`, through the primary key: a run's events are all in
        its thread (the log has no index by run)."""
        params = {"b_thread": thread_id, "b_run": run_id, "b_types": list(types)}
        return await self._store.read(
            lambda conn: list(map(EventRecord._make, conn.execute(_OF_RUN, params)))
        )
