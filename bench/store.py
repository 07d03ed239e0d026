"""How the Store's statements run, against the alternatives it was chosen over.

    .venv/bin/python -m bench.store [--rounds N]

One JSON line: microseconds per operation, on a fresh SQLite file, for two operations of the
event log's hot path (a batch of ten events for one thread: head bump plus insert, in one write
transaction; a thread read by primary key), each four ways:

- `raw_sqlite3`: hand-written SQL on a plain `sqlite3` connection (the old direct path);
- `core_prebuilt`: the Store's way, Core statements built once with bind parameters, run on a
  synchronous SQLAlchemy connection (`persistence/events.py`);
- `core_built_per_call`: the same statements built anew at every call;
- `async_engine`: the same statements through SQLAlchemy's async engine on aiosqlite (a thread
  hop per statement).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, create_engine, insert, select, update
from sqlalchemy.ext.asyncio import create_async_engine

from bench.common import emit
from persistence.sqlite.connect import open_connection
from persistence.tables import events, metadata, threads

BATCH = 10
_BUMP = (
    update(threads)
    .where(threads.c.thread_id == bindparam("b_thread"))
    .values(head_seq=threads.c.head_seq + bindparam("b_count"))
    .returning(threads.c.head_seq)
)
_BY_ID = select(threads).where(threads.c.thread_id == bindparam("b_thread"))


def _rows(thread_id: str, head: int) -> list[dict[str, Any]]:
    return [
        {
            "thread_id": thread_id,
            "seq": head - BATCH + i + 1,
            "run_id": "r",
            "type": "message.delta",
            "ts": "2026-01-01T00:00:00.000Z",
            "data": '{"message_id":"m","delta":"x"}',
        }
        for i in range(BATCH)
    ]


def _timed(call: Callable[[], object], rounds: int) -> float:
    for _ in range(min(200, rounds)):
        call()
    start = time.perf_counter()
    for _ in range(rounds):
        call()
    return round((time.perf_counter() - start) / rounds * 1e6, 1)


async def _timed_async(call: Callable[[], Any], rounds: int) -> float:
    for _ in range(min(50, rounds)):
        await call()
    start = time.perf_counter()
    for _ in range(rounds):
        await call()
    return round((time.perf_counter() - start) / rounds * 1e6, 1)


def measure(path: Path, rounds: int) -> dict[str, Any]:
    engine = create_engine(
        "sqlite://", creator=lambda: open_connection(str(path)), isolation_level="AUTOCOMMIT"
    )
    metadata.create_all(engine)
    with engine.connect() as conn:
        conn.execute(
            threads.insert(),
            [
                {
                    "thread_id": f"t{i}",
                    "tenant": "a",
                    "owner": "o",
                    "created_at": datetime.now(UTC),
                    "metadata": {},
                    "epoch": "e",
                    "head_seq": 0,
                }
                for i in range(4)
            ],
        )
    raw = open_connection(str(path))
    conn = engine.connect()

    def raw_batch() -> None:
        raw.execute("BEGIN IMMEDIATE")
        head = raw.execute(
            "UPDATE threads SET head_seq = head_seq + ? WHERE thread_id = ? RETURNING head_seq",
            (BATCH, "t0"),
        ).fetchall()[0][0]
        raw.executemany(
            "INSERT INTO events (thread_id, seq, run_id, type, ts, data) VALUES (?, ?, ?, ?, ?, ?)",
            [tuple(row.values()) for row in _rows("t0", head)],
        )
        raw.execute("COMMIT")

    def core_batch() -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        head = conn.execute(_BUMP, {"b_thread": "t1", "b_count": BATCH}).scalar_one()
        conn.execute(insert(events), _rows("t1", head))
        conn.exec_driver_sql("COMMIT")

    def built_batch() -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        head = conn.execute(
            update(threads)
            .where(threads.c.thread_id == "t2")
            .values(head_seq=threads.c.head_seq + BATCH)
            .returning(threads.c.head_seq)
        ).scalar_one()
        conn.execute(insert(events), _rows("t2", head))
        conn.exec_driver_sql("COMMIT")

    figures = {
        "batch_raw_sqlite3_us": _timed(raw_batch, rounds),
        "batch_core_prebuilt_us": _timed(core_batch, rounds),
        "batch_core_built_per_call_us": _timed(built_batch, rounds),
        "read_raw_sqlite3_us": _timed(
            lambda: raw.execute("SELECT * FROM threads WHERE thread_id = ?", ("t0",)).fetchall(),
            rounds,
        ),
        "read_core_prebuilt_us": _timed(
            lambda: conn.execute(_BY_ID, {"b_thread": "t0"}).mappings().first(), rounds
        ),
        "read_core_built_per_call_us": _timed(
            lambda: (
                conn.execute(select(threads).where(threads.c.thread_id == "t0")).mappings().first()
            ),
            rounds,
        ),
    }
    conn.close()
    raw.close()
    engine.dispose()
    figures.update(asyncio.run(_measure_async(path, max(rounds // 10, 50))))
    return figures


async def _measure_async(path: Path, rounds: int) -> dict[str, float]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")

    async def batch() -> None:
        async with engine.begin() as conn:
            head = (await conn.execute(_BUMP, {"b_thread": "t3", "b_count": BATCH})).scalar_one()
            await conn.execute(insert(events), _rows("t3", head))

    async def read() -> None:
        async with engine.connect() as conn:
            (await conn.execute(_BY_ID, {"b_thread": "t0"})).mappings().first()

    try:
        return {
            "batch_async_engine_us": await _timed_async(batch, rounds),
            "read_async_engine_us": await _timed_async(read, rounds),
        }
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(Path(folder) / "store.db", args.rounds)
    emit({"part": "store", "batch_events": BATCH, **figures})


if __name__ == "__main__":
    main()
