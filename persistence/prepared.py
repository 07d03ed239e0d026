"""The hottest statements, run on SQLite's own cursor in the SQL SQLAlchemy compiles for them.

A story run executes about forty statements, most of them the event log's (a head bump, an
insert, a lease check per group commit) and the session's. Through SQLAlchemy each costs some
30 µs of execution bookkeeping on top of SQLite's own few microseconds: more than a millisecond
a run. `Prepared` keeps a statement's Core form (written once, as every statement is) and, on
SQLite, the SQL and parameter order SQLAlchemy compiles it to, once; executing it there is one
call on the driver's cursor. Only statements whose values SQLite takes and gives back as they
are (strings, integers: no type processing either way) and whose SQL does not depend on the
values (no expanding IN lists) are prepared; any other statement, and every backend but SQLite,
runs through `conn.execute` as usual. The engine's statement observers (SQL tracing, the tests'
storage faults) are told of each execution as SQLAlchemy tells them, and driver errors reach the
caller as SQLAlchemy's, so nothing above this module can tell the two paths apart.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable

Params = Mapping[str, Any]
_SQLITE = sqlite.dialect()


class _Compiled(NamedTuple):
    sql: str
    names: tuple[str, ...]
    # The value of each parameter the caller need not give (literals compiled as parameters).
    defaults: dict[str, Any]
    required: frozenset[str]


class Prepared:
    def __init__(self, statement: Executable, *, keys: Sequence[str] | None = None) -> None:
        """`keys`: for an INSERT, the columns its rows give (the others take their defaults)."""
        self.statement = statement
        self._keys = list(keys) if keys is not None else None
        self._sqlite = _compile(statement, self._keys)

    def rows(self, conn: Connection, params: Params) -> list[tuple[Any, ...]]:
        """The rows it returns (a SELECT, or a statement with RETURNING)."""
        if self._sqlite is None or conn.dialect.name != "sqlite":
            return [tuple(row) for row in conn.execute(self.statement, dict(params))]
        return _run(conn, self._sqlite, [params], many=False).fetchall()

    def rowcount(self, conn: Connection, params: Params) -> int:
        """How many rows it changed."""
        if self._sqlite is None or conn.dialect.name != "sqlite":
            return int(conn.execute(self.statement, dict(params)).rowcount)
        return int(_run(conn, self._sqlite, [params], many=False).rowcount)

    def many(self, conn: Connection, rows: Sequence[Params]) -> None:
        """Once per parameter set (an executemany)."""
        if not rows:
            return
        if self._sqlite is None or conn.dialect.name != "sqlite":
            conn.execute(self.statement, [dict(row) for row in rows])
            return
        _run(conn, self._sqlite, rows, many=True)


def run_sql(conn: Connection, sql: str) -> None:
    """A statement without parameters (transaction control: BEGIN IMMEDIATE, COMMIT,
    ROLLBACK) on SQLite's own cursor, observers told as for every other."""
    _run(conn, _Compiled(sql, (), {}, frozenset()), [{}], many=False)


def _compile(statement: Executable, keys: list[str] | None) -> _Compiled | None:
    compiled = statement.compile(dialect=_SQLITE, column_keys=keys)  # type: ignore[attr-defined]
    if compiled.post_compile_params or compiled.literal_execute_params:
        return None  # the SQL depends on the values
    names = tuple(compiled.positiontup or ())
    binds = [compiled.binds[name] for name in names]
    if any(bind.type.dialect_impl(_SQLITE).bind_processor(_SQLITE) is not None for bind in binds):
        return None
    # What it returns: a SELECT's columns, or a statement's RETURNING columns.
    columns: Any = getattr(statement, "selected_columns", None) or getattr(
        statement, "exported_columns", ()
    )
    for column in columns:
        if column.type.dialect_impl(_SQLITE).result_processor(_SQLITE, None) is not None:
            return None
    return _Compiled(
        compiled.string,
        names,
        # By compiled name: an anonymous parameter's key is not its name in the SQL.
        {name: bind.value for name, bind in zip(names, binds, strict=True) if not bind.required},
        frozenset(name for name, bind in zip(names, binds, strict=True) if bind.required),
    )


def _run(
    conn: Connection, compiled: _Compiled, rows: Sequence[Params], *, many: bool
) -> sqlite3.Cursor:
    dbapi = conn.connection.driver_connection
    assert isinstance(dbapi, sqlite3.Connection)
    values = [_values(compiled, row) for row in rows]
    parameters: Any = values if many else values[0]
    try:
        for before in conn.dispatch.before_cursor_execute:
            before(conn, None, compiled.sql, parameters, None, many)
        if many:
            cursor = dbapi.executemany(compiled.sql, values)
        else:
            cursor = dbapi.execute(compiled.sql, values[0])
        for after in conn.dispatch.after_cursor_execute:
            after(conn, cursor, compiled.sql, parameters, None, many)
    except sqlite3.Error as exc:
        raise DBAPIError.instance(compiled.sql, parameters, exc, sqlite3.Error) from exc
    return cursor


def _values(compiled: _Compiled, row: Params) -> tuple[Any, ...]:
    missing = compiled.required - row.keys()
    if missing:
        raise KeyError(f"no value for parameter(s) {', '.join(sorted(missing))}")
    defaults = compiled.defaults
    return tuple(row[name] if name in row else defaults[name] for name in compiled.names)
