"""`Prepared` (persistence/prepared.py): the repositories' statements on SQLite's own cursor.

On SQLite a prepared statement sends the driver the SQL and the converted values SQLAlchemy's
execution would send (datetimes as text, JSON encoded, column defaults filled in), returns what
SQLAlchemy's execution returns (datetimes and JSON decoded), reaches the engine's observers,
and raises driver errors as SQLAlchemy's. Every statement the repositories prepare takes that
path: none falls back to SQLAlchemy's execution unnoticed.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, bindparam, event, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

import persistence
from persistence.prepared import OneOf, Prepared, PreparedIn
from persistence.store import Store
from persistence.tables import events, runs, threads
from persistence.threads import ThreadRecord, ThreadRepository
from tests.support.storage import migrated_store

BY_THREAD = (
    select(events.c.seq, events.c.data)
    .where(events.c.thread_id == bindparam("b_thread"))
    .order_by(events.c.seq)
)
EVENT_KEYS = ["thread_id", "seq", "run_id", "type", "ts", "data"]
THREAD_KEYS = ["thread_id", "tenant", "owner", "created_at", "metadata", "epoch"]
STATUSES = OneOf("b_status", 3)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with migrated_store(f"sqlite:///{tmp_path / 'prepared.db'}") as store:
        yield store


@contextmanager
def cursor_statements(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    """What reaches the driver's cursor: (SQL, parameters), PRAGMAs left out."""
    seen: list[tuple[str, Any]] = []

    def observe(conn: Any, cursor: Any, sql: str, parameters: Any, *args: Any) -> None:
        if not sql.startswith("PRAGMA"):
            seen.append((sql, tuple(parameters) if parameters is not None else ()))

    event.listen(engine, "before_cursor_execute", observe)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", observe)


def test_statements_whose_sql_depends_on_the_values_are_not_prepared() -> None:
    assert Prepared(BY_THREAD).prepared_on_sqlite
    many = select(events.c.seq).where(events.c.thread_id.in_(bindparam("b", expanding=True)))
    assert not Prepared(many).prepared_on_sqlite
    # A fixed number of slots keeps the SQL the same for any number of values.
    assert Prepared(select(runs.c.run_id).where(STATUSES.of(runs.c.status))).prepared_on_sqlite


def test_one_of_fills_every_slot_and_refuses_what_does_not_fit() -> None:
    assert STATUSES.params(["a"]) == {"b_status_0": "a", "b_status_1": "a", "b_status_2": "a"}
    assert STATUSES.params(["a", "b"]) == {"b_status_0": "a", "b_status_1": "b", "b_status_2": "b"}
    with pytest.raises(ValueError):
        STATUSES.params([])
    with pytest.raises(ValueError):
        STATUSES.params(["a", "b", "c", "d"])


async def test_values_are_converted_both_ways_as_sqlalchemy_converts_them(store: Store) -> None:
    """A thread row carries a datetime and JSON; its insert leaves `head_seq` to its column
    default. The same statements through SQLAlchemy's execution and through `Prepared` send
    the same SQL and values to the cursor and read back the same row."""
    (engine,) = store.statement_engines()
    created = datetime(2026, 12, 1, 18, 30, 5, 123456, tzinfo=UTC)
    row = {"tenant": "acme", "owner": "alice", "created_at": created, "epoch": "e1"}
    prepared_insert = Prepared(insert(threads), keys=THREAD_KEYS)
    by_id = select(threads).where(threads.c.thread_id == bindparam("b_thread"))
    prepared_read = Prepared(by_id)

    def both(conn: Connection) -> tuple[Any, Any]:
        conn.execute(insert(threads), {**row, "thread_id": "t-core", "metadata": {"k": [1]}})
        prepared_insert.rowcount(conn, {**row, "thread_id": "t-prep", "metadata": {"k": [1]}})
        core = [dict(r) for r in conn.execute(by_id, {"b_thread": "t-core"}).mappings()]
        return core, prepared_read.records(conn, {"b_thread": "t-prep"})

    with cursor_statements(engine) as seen:
        core, prepared = await store.write(both)
    inserts = [entry for entry in seen if entry[0].startswith("INSERT")]
    assert len(inserts) == 2
    (core_sql, core_values), (prepared_sql, prepared_values) = inserts
    assert prepared_sql == core_sql
    assert prepared_values[1:] == core_values[1:]  # all but the thread id
    reads = [entry for entry in seen if entry[0].startswith("SELECT")]
    assert reads[0][0] == reads[1][0]
    (core_row,), (prepared_row,) = core, prepared
    assert {**prepared_row, "thread_id": "t-core"} == core_row
    assert prepared_row["metadata"] == {"k": [1]}
    assert prepared_row["head_seq"] == 0
    assert prepared_row["created_at"].replace(tzinfo=UTC) == created
    record = await ThreadRepository(store).get("t-prep")
    assert record == ThreadRecord.from_row(core_row | {"thread_id": "t-prep"})


async def test_observers_see_every_statement_and_errors_are_sqlalchemys(store: Store) -> None:
    thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
    prepared_insert, prepared_read = Prepared(insert(events), keys=EVENT_KEYS), Prepared(BY_THREAD)
    rows = [
        {"thread_id": thread.thread_id, "seq": n, "run_id": None, "type": "t", "ts": "x"}
        | {"data": f'{{"n":{n}}}'}
        for n in range(1, 4)
    ]
    (engine,) = store.statement_engines()
    params = {"b_thread": thread.thread_id}
    with cursor_statements(engine) as seen:
        await store.write(lambda conn: prepared_insert.many(conn, rows))
        via_prepared = await store.read(lambda conn: prepared_read.rows(conn, params))
    via_sqlalchemy = await store.read(
        lambda conn: [tuple(row) for row in conn.execute(BY_THREAD, params)]
    )
    assert via_prepared == via_sqlalchemy == [(n, f'{{"n":{n}}}') for n in range(1, 4)]
    assert [sql.split()[0] for sql, _ in seen] == ["BEGIN", "INSERT", "COMMIT", "SELECT"]
    # A driver error arrives as SQLAlchemy's, and the transaction is rolled back whole.
    with pytest.raises(IntegrityError):
        await store.write(lambda conn: prepared_insert.many(conn, [*rows[:1], *rows[:1]]))
    assert await store.read(lambda conn: prepared_read.rows(conn, params)) == via_prepared
    with pytest.raises(KeyError):
        await store.read(lambda conn: prepared_read.rows(conn, {}))


async def test_a_fixed_slot_in_list_matches_any_number_of_values(store: Store) -> None:
    await ThreadRepository(store).create(tenant="acme", owner="alice")
    swap = Prepared(
        update(threads)
        .where(threads.c.tenant == bindparam("b_tenant"), STATUSES.of(threads.c.owner))
        .values(owner=bindparam("b_owner"))
    )

    def moved(owners: list[str], to: str) -> Any:
        params = {"b_tenant": "acme", "b_owner": to, **STATUSES.params(owners)}
        return store.write(lambda conn: swap.rowcount(conn, params))

    assert await moved(["bob"], "carol") == 0
    assert await moved(["bob", "alice"], "carol") == 1
    assert await moved(["carol"], "dave") == 1


async def test_an_in_list_of_any_length_reads_what_an_expanding_one_reads(store: Store) -> None:
    """Across the sizes of slots and past the largest (in chunks), with the statement's other
    parameters beside the list."""
    repo = ThreadRepository(store)
    ids = sorted([(await repo.create(tenant="acme", owner="alice")).thread_id for _ in range(40)])
    ids += [f"t-absent-{n}" for n in range(PreparedIn.SIZES[-1] + 10)]
    heads = PreparedIn(
        "b_thread",
        lambda one_of: (
            select(threads.c.thread_id, threads.c.head_seq)
            .where(one_of.of(threads.c.thread_id), threads.c.tenant == bindparam("b_tenant"))
            .order_by(threads.c.thread_id)
        ),
    )
    expanding = (
        select(threads.c.thread_id, threads.c.head_seq)
        .where(threads.c.thread_id.in_(bindparam("b", expanding=True)))
        .order_by(threads.c.thread_id)
    )
    for count in (1, 8, 9, 40, len(ids)):
        values = ids[:count]
        found = await store.read(partial(heads.rows, values=values, params={"b_tenant": "acme"}))
        expected = await store.read(
            lambda conn, values=values: [tuple(r) for r in conn.execute(expanding, {"b": values})]
        )
        assert found == expected
        assert len(found) == min(count, 40)
    assert await store.read(lambda conn: heads.rows(conn, ids, {"b_tenant": "other"})) == []


async def test_rows_given_as_tuples_reach_the_cursor_as_they_are(store: Store) -> None:
    """`many_rows`: in the SQL's order the tuples go to the driver untouched; in another
    order they go the way of dicts, and the same rows are stored."""
    thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
    prepared_insert = Prepared(insert(events), keys=EVENT_KEYS)
    in_order = [(thread.thread_id, n, None, "t", "x", f'{{"n":{n}}}') for n in (1, 2)]
    names = ("seq", "thread_id", "run_id", "type", "ts", "data")
    reordered = [(3, thread.thread_id, None, "t", "x", '{"n":3}')]
    (engine,) = store.statement_engines()
    with cursor_statements(engine) as seen:
        await store.write(lambda conn: prepared_insert.many_rows(conn, tuple(EVENT_KEYS), in_order))
        await store.write(lambda conn: prepared_insert.many_rows(conn, names, reordered))
    inserts = [values for sql, values in seen if sql.startswith("INSERT")]
    assert inserts[0] == tuple(in_order)
    assert inserts[1] == ((thread.thread_id, 3, None, "t", "x", '{"n":3}'),)
    stored = await store.read(
        lambda conn: Prepared(BY_THREAD).rows(conn, {"b_thread": thread.thread_id})
    )
    assert stored == [(n, f'{{"n":{n}}}') for n in (1, 2, 3)]


def _prepared_statements() -> Iterator[tuple[str, Prepared]]:
    for module_info in pkgutil.walk_packages(persistence.__path__, "persistence."):
        if "migrations" in module_info.name:
            continue
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            candidates = value.values() if isinstance(value, dict) else [value]
            for candidate in candidates:
                if isinstance(candidate, Prepared):
                    yield f"{module_info.name}.{name}", candidate
                elif isinstance(candidate, PreparedIn):
                    for size, statement in zip(PreparedIn.SIZES, candidate.statements, strict=True):
                        yield f"{module_info.name}.{name}[{size}]", statement


def test_every_statement_a_repository_prepares_runs_on_the_driver_cursor() -> None:
    statements = dict(_prepared_statements())
    assert len(statements) >= 30  # the inventory finds the repositories' statements
    assert [name for name, s in statements.items() if not s.prepared_on_sqlite] == []
