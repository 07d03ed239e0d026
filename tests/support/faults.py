"""Storage faults for tests: make chosen SQL statements of a running gateway fail, then heal.

The faults sit just below the Store seam (persistence/store.py): a `before_cursor_execute`
listener on the store's own engines (`Store.statement_engines`, through which every statement
of the production path runs) raises the backend driver's own `OperationalError` for every
statement a predicate picks, while a fault is set, with the message the database gives for that
kind of trouble (`Fault`). SQLAlchemy wraps it like any driver error, so the gateway sees what a
real outage would give it; the database itself stays intact. A failing COMMIT is the statement
`COMMIT` on SQLite and the transaction's commit on PostgreSQL (a `commit` listener).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from starlette.applications import Starlette

import tests.support.gateway as gateway_support
from gateway.agents.registry import AgentRegistry
from gateway.resources import Services
from gateway.settings import Settings
from persistence.store import Store
from tests.support.gateway import Gateway

# (`UPDATE SET` is an upsert's `ON CONFLICT DO UPDATE SET`, which names no table.)
_WRITE = re.compile(
    r'(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE(?!\s+SET\b)|DELETE\s+FROM)\s+"?(\w+)"?', re.I
)
_WITH = re.compile(r"^\s*WITH\s", re.I)


def written_tables(statement: str) -> set[str]:
    """The tables a statement writes: an INSERT, UPDATE or DELETE's own, and for a statement
    led by data-modifying CTEs (PostgreSQL's one-statement appends), theirs too."""
    if _WITH.match(statement):
        return {table.lower() for table in _WRITE.findall(statement)}
    found = _WRITE.match(statement.lstrip())
    return {found.group(1).lower()} if found else set()


# (SQL text, bound parameters) -> fail this statement?
Predicate = Callable[[str, Any], bool]


def writes_to(*tables: str) -> Predicate:
    """INSERT/UPDATE/DELETE statements on any of `tables`; reads still work."""
    wanted = {t.lower() for t in tables}

    def match(statement: str, parameters: Any) -> bool:
        return not wanted.isdisjoint(written_tables(statement))

    return match


def checkpoint_writes(reason: str) -> Predicate:
    """Inserts of checkpoints taken for `reason` (approval, turn, disconnect, shutdown)."""
    is_write = writes_to("checkpoints")

    def match(statement: str, parameters: Any) -> bool:
        return is_write(statement, parameters) and reason in _values(parameters)

    return match


def writes_containing(table: str, needle: str) -> Predicate:
    """Writes to `table` with a bound value that contains `needle` (e.g. a call id)."""
    is_write = writes_to(table)

    def match(statement: str, parameters: Any) -> bool:
        return is_write(statement, parameters) and any(
            isinstance(value, str) and needle in value for value in _values(parameters)
        )

    return match


def lease_takes(statement: str, parameters: Any) -> bool:
    """A run's lease being taken or renewed: an UPDATE of `runs` that sets its owner."""
    return writes_to("runs")(statement, parameters) and "lease_owner=" in statement.replace(" ", "")


def from_first(trigger: Predicate, then: Predicate) -> Predicate:
    """Nothing fails until a statement matches `trigger`; from it on, whatever `then` picks."""
    tripped = False

    def match(statement: str, parameters: Any) -> bool:
        nonlocal tripped
        tripped = tripped or trigger(statement, parameters)
        return tripped and then(statement, parameters)

    return match


def commits(statement: str, parameters: Any) -> bool:
    """The COMMIT of a transaction, after all its statements ran."""
    return statement.strip().upper() == "COMMIT"


def any_write(statement: str, parameters: Any) -> bool:
    return bool(written_tables(statement))


def select_one(statement: str, parameters: Any) -> bool:
    """The readiness probe's `SELECT 1`."""
    return statement.strip().upper() == "SELECT 1"


def every_statement(statement: str, parameters: Any) -> bool:
    return True


def _values(parameters: Any) -> list[Any]:
    """Bound values of one execution or of an executemany, flattened."""
    if isinstance(parameters, dict):
        return list(parameters.values())
    if isinstance(parameters, (list, tuple)):
        flat: list[Any] = []
        for item in parameters:
            flat.extend(_values(item) if isinstance(item, (list, tuple, dict)) else [item])
        return flat
    return [parameters]


class Fault(Enum):
    """What the database says, per kind of trouble (SQLite's own messages)."""

    IO = "disk I/O error"
    DISK_FULL = "database or disk is full"
    READ_ONLY = "attempt to write a readonly database"
    LOCKED = "database is locked"


@dataclass
class StorageFaults:
    """Switchable failures on one store; counts the statements it failed."""

    store: Store
    hits: int = 0
    failed: list[str] = field(default_factory=list)
    _predicate: Predicate | None = None
    _fault: Fault = Fault.IO
    _installed: bool = False

    def install(self) -> None:
        for engine in self.store.statement_engines():
            event.listen(engine, "before_cursor_execute", self._before)
            event.listen(engine, "commit", self._on_commit)
        self._installed = True

    def remove(self) -> None:
        if self._installed:
            for engine in self.store.statement_engines():
                event.remove(engine, "before_cursor_execute", self._before)
                event.remove(engine, "commit", self._on_commit)
            self._installed = False

    def fail(self, predicate: Predicate, fault: Fault = Fault.IO) -> None:
        """From now on, statements matching `predicate` fail as `fault` does."""
        self._fault = fault
        self._predicate = predicate

    def heal(self) -> None:
        self._predicate = None

    @property
    def active(self) -> bool:
        return self._predicate is not None

    async def wait_hits(self, count: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while self.hits < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.hits} of {count} statements failed in {timeout} s")
            await asyncio.sleep(0.01)

    def _hit(self, statement: str, parameters: Any) -> bool:
        predicate = self._predicate
        if predicate is None or not predicate(statement, parameters):
            return False
        self.hits += 1
        self.failed.append(statement.split("\n", 1)[0][:120])
        return True

    def _error(self, dialect: Any) -> Exception:
        error = dialect.loaded_dbapi.OperationalError(self._fault.value)
        if self._fault is Fault.LOCKED and isinstance(error, sqlite3.OperationalError):
            error.sqlite_errorcode = sqlite3.SQLITE_BUSY  # what SQLite's own error carries
        return error

    def _before(
        self,
        conn: Any,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        if self._hit(statement, parameters):
            raise self._error(conn.dialect)

    def _on_commit(self, conn: Any) -> None:
        # SQLite's commits are COMMIT statements (seen by `_before`); this is PostgreSQL's.
        if conn.dialect.name != "sqlite" and self._hit("COMMIT", None):
            error = self._error(conn.dialect)
            raise OperationalError("COMMIT", None, error) from error


@dataclass
class FaultyGateway:
    gateway: Gateway
    services: Services
    faults: StorageFaults


@contextlib.asynccontextmanager
async def faulty_gateway(
    settings: Settings, registry: AgentRegistry | None = None
) -> AsyncIterator[FaultyGateway]:
    """`running_gateway` plus a `StorageFaults` on the app's engine (removed before shutdown)."""
    apps: list[Starlette] = []
    original = gateway_support.create_app

    def capturing(*args: Any, **kwargs: Any) -> Starlette:
        app = original(*args, **kwargs)
        apps.append(app)
        return app

    async with contextlib.AsyncExitStack() as stack:
        gateway_support.create_app = capturing  # type: ignore[assignment]
        try:
            gw = await stack.enter_async_context(
                gateway_support.running_gateway(settings, registry)
            )
        finally:
            gateway_support.create_app = original  # type: ignore[assignment]
        services: Services = apps[-1].state.services
        faults = StorageFaults(services.store)
        faults.install()
        stack.callback(faults.remove)
        yield FaultyGateway(gw, services, faults)
