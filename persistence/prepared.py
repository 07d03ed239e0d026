"""The repositories' statements, run on the driver's own connection in the SQL SQLAlchemy
compiles.

A refund run executes about seventy statements (the event log's head bumps, inserts and lease
checks, the session's, the run's status swaps, its checkpoint, approvals and audit rows).
Through SQLAlchemy's execution each costs some 20-30 µs of bookkeeping on SQLite, on top of
SQLite's own few microseconds, and on PostgreSQL over asyncpg about 100 µs (an execution
context, a cursor adapter and a greenlet hop per statement): well over a millisecond a run.
`Prepared` keeps a statement's Core form (written once, as every statement is) and, for each
SQLite or asyncpg dialect it meets, the SQL and parameter order SQLAlchemy compiles it to, with
the type processors SQLAlchemy would apply to each parameter and each returned column
(datetimes as text, JSON encoded and decoded) and the scalar column defaults it would fill in.
Executing it is one call on SQLite's cursor, or on asyncpg's connection inside the transaction
SQLAlchemy began, through the statements SQLAlchemy's asyncpg adapter prepared and caches.
Statements whose SQL depends on the values (expanding IN lists: use `PreparedIn`, or one
statement per value with `many`) or whose defaults are computed at execution are not prepared:
they run through `conn.execute` as usual. The engine's statement observers (SQL tracing, the
tests' storage faults) are told of each execution as SQLAlchemy tells them, and driver errors
reach the caller as SQLAlchemy's, so nothing above this module can tell the two paths apart.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol
from weakref import ReferenceType, WeakKeyDictionary, ref

from sqlalchemy import ColumnElement, bindparam
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable
from sqlalchemy.util import await_only

Params = Mapping[str, Any]
Record = dict[str, Any]
Convert = Callable[[Any], Any]


class _Compiled(NamedTuple):
    sql: str
    names: tuple[str, ...]
    # The value of each parameter the caller need not give (literals compiled as parameters,
    # scalar column defaults of an INSERT or UPDATE).
    defaults: dict[str, Any]
    required: frozenset[str]
    # (position, bind processor) of each parameter SQLAlchemy converts on the way in.
    binds: tuple[tuple[int, Convert], ...]
    # The keys of the returned columns, and (position, result processor) of those it converts.
    keys: tuple[str, ...]
    results: tuple[tuple[int, Convert], ...]


class Prepared:
    def __init__(self, statement: Executable, *, keys: Sequence[str] | None = None) -> None:
        """`keys`: for an INSERT, the columns its rows give (the others take their defaults)."""
        self.statement = statement
        self._keys = list(keys) if keys is not None else None
        # One compilation per SQLite dialect (each engine has its own, with its own JSON
        # serializer); forgotten with the engine.
        self._compiled: WeakKeyDictionary[Dialect, _Compiled | None] = WeakKeyDictionary()
        # The dialect of the last call and its compilation: a process has one SQLite engine
        # whose statements run thousands of times a second, and a weak dictionary's lookup
        # (a weak reference made per call) costs more than the rest of `_for`.
        self._last: tuple[ReferenceType[Dialect], _Compiled | None] | None = None

    def rows(self, conn: Connection, params: Params) -> list[tuple[Any, ...]]:
        """The rows it returns (a SELECT, or a statement with RETURNING)."""
        compiled = self._for(conn)
        if compiled is None:
            return [tuple(row) for row in conn.execute(self.statement, dict(params))]
        return _converted(compiled, _run_one(conn, compiled, params).fetchall())

    def records(self, conn: Connection, params: Params) -> list[Record]:
        """The rows it returns, each as a dict by column key."""
        compiled = self._for(conn)
        if compiled is None:
            return [dict(row) for row in conn.execute(self.statement, dict(params)).mappings()]
        rows = _converted(compiled, _run_one(conn, compiled, params).fetchall())
        return [dict(zip(compiled.keys, row, strict=True)) for row in rows]

    def record(self, conn: Connection, params: Params) -> Record | None:
        """The first row it returns as a dict by column key, or None."""
        found = self.records(conn, params)
        return found[0] if found else None

    def rowcount(self, conn: Connection, params: Params) -> int:
        """How many rows it changed."""
        compiled = self._for(conn)
        if compiled is None:
            return int(conn.execute(self.statement, dict(params)).rowcount)
        return int(_run_one(conn, compiled, params).rowcount)

    def many(self, conn: Connection, rows: Sequence[Params]) -> None:
        """Once per parameter set (an executemany)."""
        if not rows:
            return
        compiled = self._for(conn)
        if compiled is None:
            conn.execute(self.statement, [dict(row) for row in rows])
            return
        _run(conn, compiled.sql, [_values(compiled, row) for row in rows], many=True)

    def many_rows(
        self, conn: Connection, names: tuple[str, ...], rows: Sequence[tuple[Any, ...]]
    ) -> None:
        """`many` with each parameter set given as values in the order of `names`. Where that
        is the order of the SQL's parameters and none is converted, the rows go to the driver
        as they are: the event log writes a row per event, and a dict per row, then a tuple in
        the SQL's order, cost more than the insert itself."""
        if not rows:
            return
        compiled = self._for(conn)
        if compiled is not None and names == compiled.names and not compiled.binds:
            _run(conn, compiled.sql, rows, many=True)
            return
        self.many(conn, [dict(zip(names, row, strict=True)) for row in rows])

    @property
    def prepared_on_sqlite(self) -> bool:
        """Whether SQLite runs it on the driver's cursor (for tests and reviews)."""
        return _compile(self.statement, self._keys, sqlite.dialect()) is not None

    def _for(self, conn: Connection) -> _Compiled | None:
        dialect = conn.dialect
        last = self._last
        if last is not None and last[0]() is dialect:
            return last[1]
        compiled: _Compiled | None = None
        if dialect.name == "sqlite" or dialect.driver == "asyncpg":
            try:
                compiled = self._compiled[dialect]
            except KeyError:
                compiled = self._compiled[dialect] = _compile(self.statement, self._keys, dialect)
        self._last = (ref(dialect), compiled)
        return compiled


class OneOf:
    """`column IN (...)` over a fixed number of parameters, so the SQL does not change with
    how many values a call gives (an expanding IN list is rendered anew at every execution
    and cannot be prepared): the values fill the slots, the last repeated into the rest."""

    def __init__(self, name: str, slots: int) -> None:
        self._names = [f"{name}_{slot}" for slot in range(slots)]

    def of(self, column: ColumnElement[Any]) -> ColumnElement[bool]:
        return column.in_([bindparam(name) for name in self._names])

    def params(self, values: Sequence[Any]) -> dict[str, Any]:
        if not values or len(values) > len(self._names):
            raise ValueError(f"between 1 and {len(self._names)} values, not {len(values)}")
        return {name: values[min(n, len(values) - 1)] for n, name in enumerate(self._names)}


class PreparedIn:
    """A statement with `column IN (...)` over any number of values, prepared: built (by
    `build`, given the `OneOf` to filter with) in a few sizes of fixed slots, each call taking
    the smallest that holds its values, and more than the largest holds in chunks of it, in
    the order given (keep it sorted where the statement locks rows). An IN list that repeats
    its last value returns no row twice."""

    # Powers of two: a call fills at most twice the slots it needs. Each unused slot still
    # costs a parameter to bind and compare (the event log's fencing read and heads, 44 threads
    # in 128 slots: a ninth of a batch's commit on SQLite, docs/benchmarks.md).
    SIZES = (8, 16, 32, 64, 128, 256, 512)

    def __init__(self, name: str, build: Callable[[OneOf], Executable]) -> None:
        self._one_ofs = [OneOf(name, size) for size in self.SIZES]
        self.statements = [Prepared(build(one_of)) for one_of in self._one_ofs]

    def rows(
        self, conn: Connection, values: Sequence[Any], params: Params | None = None
    ) -> list[tuple[Any, ...]]:
        """The rows it returns for `values` (and the statement's other `params`)."""
        found: list[tuple[Any, ...]] = []
        largest = self.SIZES[-1]
        for start in range(0, len(values), largest):
            chunk = values[start : start + largest]
            index = next(i for i, size in enumerate(self.SIZES) if size >= len(chunk))
            slots = self._one_ofs[index].params(chunk)
            found.extend(self.statements[index].rows(conn, {**(params or {}), **slots}))
        return found


def run_sql(conn: Connection, sql: str) -> None:
    """A statement without parameters (transaction control: BEGIN IMMEDIATE, COMMIT,
    ROLLBACK) on SQLite's own cursor, observers told as for every other."""
    _run(conn, sql, (), many=False)


def run_statements(conn: Connection, statements: Sequence[str]) -> None:
    """Statements without parameters (savepoints), in order, observers told as for every
    other: on PostgreSQL in one round trip (asyncpg's simple query protocol takes several
    statements at once), on SQLite one call each."""
    if isinstance(conn.connection.dbapi_connection, sqlite3.Connection):
        for sql in statements:
            run_sql(conn, sql)
        return
    _run(conn, "; ".join(statements), None, many=False)


def _compile(statement: Executable, keys: list[str] | None, dialect: Dialect) -> _Compiled | None:
    compiled: Any = statement.compile(dialect=dialect, column_keys=keys)  # type: ignore[attr-defined]
    if compiled.post_compile_params or compiled.literal_execute_params:
        return None  # the SQL depends on the values
    defaults: dict[str, Any] = {}
    for column in [*compiled.insert_prefetch, *compiled.update_prefetch]:
        default = column.default if column in compiled.insert_prefetch else column.onupdate
        if default is None or not default.is_scalar:
            return None  # computed at each execution
        defaults[column.key] = default.arg
    names = tuple(compiled.positiontup or ())
    required: set[str] = set()
    binds: list[tuple[int, Convert]] = []
    for position, name in enumerate(names):
        bind = compiled.binds[name]
        if bind.required and name not in defaults:
            required.add(name)
        elif name not in defaults:
            # By compiled name: an anonymous parameter's key is not its name in the SQL.
            defaults[name] = bind.value
        process = bind.type._cached_bind_processor(dialect)
        if process is not None:
            binds.append((position, process))
    # What it returns: a SELECT's columns, or a statement's RETURNING columns.
    columns: Any = getattr(statement, "selected_columns", None) or getattr(
        statement, "exported_columns", ()
    )
    results = [
        (position, process)
        for position, column in enumerate(columns)
        if (process := column.type._cached_result_processor(dialect, None)) is not None
    ]
    return _Compiled(
        compiled.string,
        names,
        defaults,
        frozenset(required),
        tuple(binds),
        tuple(column.key for column in columns),
        tuple(results),
    )


def _run_one(conn: Connection, compiled: _Compiled, params: Params) -> Executed:
    return _run(conn, compiled.sql, _values(compiled, params), many=False)


def _run(conn: Connection, sql: str, parameters: Any, *, many: bool) -> Executed:
    """`parameters`: one tuple in the SQL's order, or (`many`) a sequence of them; None on
    PostgreSQL for statements without parameters, several in one string."""
    # pysqlite's driver connection is its DBAPI connection, an attribute here (the
    # `driver_connection` property walks three more calls to the same object).
    dbapi = conn.connection.dbapi_connection
    error: type[Exception] = (
        sqlite3.Error if isinstance(dbapi, sqlite3.Connection) else conn.dialect.loaded_dbapi.Error
    )
    # SQLAlchemy's own test for listeners on the connection or its engine: walking the (empty)
    # listener lists costs more than the rest of the bookkeeping here.
    observed = conn._has_events or conn.engine._has_events
    try:
        if observed:
            for before in conn.dispatch.before_cursor_execute:
                before(conn, None, sql, parameters, None, many)
        result: Executed
        if not isinstance(dbapi, sqlite3.Connection):
            result = _run_asyncpg(conn, dbapi, sql, parameters, many=many)
        elif many:
            result = dbapi.executemany(sql, parameters)
        else:
            result = dbapi.execute(sql, parameters)
        if observed:
            for after in conn.dispatch.after_cursor_execute:
                after(conn, result, sql, parameters, None, many)
    except error as exc:
        raise DBAPIError.instance(sql, parameters, exc, error) from exc
    return result


class Executed(Protocol):
    """What an execution gives back: SQLite's cursor, or `_AsyncpgResult`."""

    @property
    def rowcount(self) -> int: ...

    def fetchall(self) -> list[Any]: ...


class _AsyncpgResult:
    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchall(self) -> list[Any]:
        return self._rows


# The row count a command tag ends with: `UPDATE 3`, `DELETE 0`, `INSERT 0 1`, `SELECT 2`.
_COUNTED = re.compile(r"(?:SELECT|UPDATE|DELETE|INSERT \d+) (\d+)")


def _run_asyncpg(
    conn: Connection, adapter: Any, sql: str, parameters: Any, *, many: bool
) -> _AsyncpgResult:
    """The statement on asyncpg's own connection, as SQLAlchemy's asyncpg cursor runs it (in
    the transaction SQLAlchemy began, on the statements it prepared and caches), without the
    execution context SQLAlchemy builds around each call. Runs inside the Store's greenlet,
    which `await_only` suspends. asyncpg's errors come out as the DBAPI errors
    SQLAlchemy's cursor would raise."""
    try:
        return await_only(
            _asyncpg_execute(
                adapter,
                sql,
                parameters,
                many=many,
                # When the dialect last saw the schema change (SQLAlchemy's own cursor reads
                # it too): statements prepared before then are prepared again.
                schema_as_of=conn.dialect._invalidate_schema_cache_asof,  # type: ignore[attr-defined]
            )
        )
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "asyncpg":
            raise
        adapter._handle_exception(exc)  # raises the translated error
        raise


async def _asyncpg_execute(
    adapter: Any, sql: str, parameters: Any, *, many: bool, schema_as_of: float
) -> _AsyncpgResult:
    # What `AsyncAdapt_asyncpg_cursor._prepare_and_execute` and `_executemany` do.
    async with adapter._execute_mutex:
        if many:
            await adapter._check_type_cache_invalidation(schema_as_of)
        if adapter._transaction is None:
            await adapter._start_transaction()
        if many:
            await adapter._connection.executemany(sql, parameters)
            return _AsyncpgResult([], -1)
        if parameters is None:
            await adapter._connection.execute(sql)
            return _AsyncpgResult([], -1)
        statement, _ = await adapter._prepare(sql, schema_as_of)
        rows = await statement.fetch(*parameters)
        counted = _COUNTED.match(statement.get_statusmsg() or "")
        # Plain tuples, as SQLite's cursor gives: callers compare and unpack them.
        return _AsyncpgResult(list(map(tuple, rows)), int(counted.group(1)) if counted else -1)


def _values(compiled: _Compiled, row: Params) -> tuple[Any, ...]:
    if not row.keys() >= compiled.required:  # compared in place: no set made per call
        missing = compiled.required - row.keys()
        raise KeyError(f"no value for parameter(s) {', '.join(sorted(missing))}")
    defaults = compiled.defaults
    values = [row[name] if name in row else defaults[name] for name in compiled.names]
    for position, process in compiled.binds:
        values[position] = process(values[position])
    return tuple(values)


def _converted(compiled: _Compiled, rows: list[Any]) -> list[tuple[Any, ...]]:
    if not compiled.results:
        return rows
    converted = []
    for row in rows:
        values = list(row)
        for position, process in compiled.results:
            values[position] = process(values[position])
        converted.append(tuple(values))
    return converted
