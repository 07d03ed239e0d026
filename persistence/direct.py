"""Statements on a plain `sqlite3` connection, storing values exactly as the engine does.

The direct SQLite path (`SqliteEventStore` in persistence/events.py) runs a whole transaction or
read in one hop to its own thread. The repositories write their hot statements for it in SQL
next to their SQLAlchemy versions; what must not differ between the two is how a value is
stored (a `DateTime` as SQLAlchemy's SQLite text, a `JSON` column through the engine's JSON
serializer) and read back. `Direct` takes both from the engine's own dialect and the tables'
column types, so a row written on one path reads back identically on the other.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Column, Table
from sqlalchemy.engine import Dialect

from persistence.tables import metadata

Processor = Callable[[Any], Any]


class _TableCodec:
    def __init__(self, table: Table, dialect: Dialect) -> None:
        self.name = table.name
        self.columns = [column.name for column in table.columns]
        self.bind: dict[str, Processor] = {}
        self.result: dict[str, Processor] = {}
        # Types that store None as a value of their own (JSON's `null`), as the engine does.
        self.evaluate_none = {c.name for c in table.columns if c.type.should_evaluate_none}
        # Python-side scalar defaults (`Column(default=0)`), applied by SQLAlchemy on insert.
        self.defaults: dict[str, Any] = {}
        for column in table.columns:
            impl = column.type.dialect_impl(dialect)
            bind = impl.bind_processor(dialect)
            if bind is not None:
                self.bind[column.name] = bind
            result = impl.result_processor(dialect, None)
            if result is not None:
                self.result[column.name] = result
            default = column.default
            if default is not None and getattr(default, "is_scalar", False):
                self.defaults[column.name] = default.arg  # type: ignore[attr-defined]
        self.select_list = ", ".join(self.columns)
        # Filled by the writer's thread only (inserts are writes).
        self._inserts: dict[tuple[str, ...], str] = {}

    def insert_sql(self, keys: tuple[str, ...]) -> str:
        sql = self._inserts.get(keys)
        if sql is None:
            marks = ", ".join("?" for _ in keys)
            sql = self._inserts[keys] = (
                f"INSERT INTO {self.name} ({', '.join(keys)}) VALUES ({marks})"
            )
        return sql

    def encode(self, name: str, value: Any) -> Any:
        bind = self.bind.get(name)
        if bind is None or (value is None and name not in self.evaluate_none):
            return value
        return bind(value)

    def decode(self, row: Sequence[Any]) -> dict[str, Any]:
        values = dict(zip(self.columns, row, strict=True))
        for name, process in self.result.items():
            value = values[name]
            if value is not None:
                values[name] = process(value)
        return values


class Codecs:
    """How each column of the gateway's tables is stored, per the engine's dialect.

    Built once for every table, so the direct path's threads only ever read this."""

    def __init__(self, dialect: Dialect) -> None:
        self._tables = {t.name: _TableCodec(t, dialect) for t in metadata.tables.values()}

    def table(self, table: Table) -> _TableCodec:
        return self._tables[table.name]


class Direct:
    """One `sqlite3` connection inside a direct-path transaction or read (one thread)."""

    def __init__(self, conn: sqlite3.Connection, codecs: Codecs) -> None:
        self.conn = conn
        self._codecs = codecs

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def changed(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a write; how many rows it changed."""
        return self.conn.execute(sql, params).rowcount

    def value(self, column: Column[Any], value: Any) -> Any:
        """`value` as the engine would bind it for `column` (a datetime as stored text)."""
        table = column.table
        assert isinstance(table, Table)
        return self._codecs.table(table).encode(column.name, value)

    def insert(self, table: Table, rows: Iterable[Mapping[str, Any]]) -> None:
        """INSERT rows given as column -> value (Python values, encoded like the engine's)."""
        codec = self._codecs.table(table)
        batches: dict[tuple[str, ...], list[list[Any]]] = {}
        for row in rows:
            values = {**codec.defaults, **row}
            keys = tuple(values)
            batches.setdefault(keys, []).append([codec.encode(k, values[k]) for k in keys])
        for keys, params in batches.items():
            self.conn.executemany(codec.insert_sql(keys), params)

    def select(
        self, table: Table, where: str, params: Sequence[Any] = (), tail: str = ""
    ) -> list[dict[str, Any]]:
        """Whole rows of `table` matching `where`, decoded as the engine would (a mapping per
        row, accepted by the records' `from_row`)."""
        codec = self._codecs.table(table)
        sql = f"SELECT {codec.select_list} FROM {codec.name} WHERE {where} {tail}"
        return [codec.decode(row) for row in self.conn.execute(sql, params).fetchall()]

    def scalars(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return [row[0] for row in self.conn.execute(sql, params).fetchall()]


def placeholders(count: int) -> str:
    """`?, ?, ...` for an IN list of `count` values."""
    return ", ".join("?" for _ in range(count))
