"""The Store seam: the one way the gateway reaches its durable state.

Every repository operation is a plain function of a SQLAlchemy `Connection`, written once with
Core statements (`*_in` in the repositories). A `Store` runs such a function as one write
transaction (`write`) or as a read (`read`) on its backend, and turns the backend's failures
into `StorageUnavailable` (retry later, nothing was changed). One implementation per backend,
chosen from the database URL by `open_store` (persistence/backends.py):

- SQLite (`persistence/sqlite/`): synchronous connections that run their work on the event
  loop's own thread whenever they can (lanes), because SQLite's work is tens of microseconds
  and any thread hop costs more than that under load.
- PostgreSQL (`persistence/postgres/`): the same functions through asyncpg, each transaction
  on a pooled connection (a SQLAlchemy greenlet drives the synchronous code over the async
  driver).

Statement observers (the tests' storage faults, SQL tracing) listen on `statement_engines()`:
every statement of every operation goes through them, on the path production uses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Engine, text
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.protocol.error_codes import CodedError
from persistence.errors import StorageUnavailable
from persistence.events import (
    Announce,
    EventRecord,
    NewEvent,
    append_fenced_in,
    commit_in,
    read_in,
)
from persistence.leases import Lease
from persistence.prepared import run_statements

T = TypeVar("T")

# A repository operation: Core statements on one connection, inside the Store's transaction.
Work = Callable[[Connection], T]

_SELECT_ONE = text("SELECT 1")


class DatabaseConfigError(CodedError, ValueError):
    """The database URL cannot be used (unknown backend, missing driver)."""


class Store(ABC):
    """One backend's connections; see the module docstring."""

    def __init__(self, url: URL) -> None:
        self.url = url

    @property
    def backend(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.url.get_backend_name()

    @property
    @abstractmethod
    def engine(self) -> AsyncEngine:
        """An async engine on the same database, for code that wants one: the SDK's session
        (`SQLAlchemySession`) and the migrations."""

    @abstractmethod
    def statement_engines(self) -> Sequence[Engine]:
        """The engines whose events see every statement this store runs."""

    @abstractmethod
    async def write(
        self,
        work: Work[T],
        *,
        slow: bool = False,
        single_statement: bool = False,
        log_writer: bool = False,
    ) -> T:
        """`work` in one write transaction; its result. An exception from `work` rolls the
        transaction back and reaches the caller unchanged (`IntegrityError` included).

        `slow` work (a retention sweep over hundreds of runs) never runs on the event loop's
        thread, where a backend would otherwise run short work. `single_statement` work runs
        exactly one statement, atomic on its own, so a backend may run it without a
        transaction around it (PostgreSQL: no BEGIN and COMMIT, two round trips fewer).
        `log_writer`: the event log's writer, which writes one transaction at a time; a
        backend with a pool keeps a connection for it alone, so the commits every streamed
        event waits for never queue behind other work for a connection."""

    @abstractmethod
    async def read(self, work: Work[T], *, bulk: bool = False) -> T:
        """`work` as a read: each statement sees what was committed before it ran. `bulk` reads
        (replay pages) may be given connections of their own, so they never hold up the
        short reads of decisions and runs."""

    @abstractmethod
    async def close(self) -> None: ...

    # -- the event log's operations, the same on every backend ------------------------------

    async def append(
        self, batch: Sequence[NewEvent], announce: Announce | None = None
    ) -> tuple[list[EventRecord], set[Lease]]:
        """Store the events whose lease (`NewEvent.lease`) still holds, in one transaction; the
        stored records (in batch order) and the leases found lost. `announce` sees the records
        in that transaction."""
        return await self.write(
            partial(append_fenced_in, batch=list(batch), announce=announce),
            # Without an announcement, one statement where the backend has one for it.
            single_statement=announce is None and self.backend == "postgresql",
            log_writer=True,
        )

    async def commit(
        self,
        batch: Sequence[NewEvent],
        work: Work[T] | None,
        announce: Announce | None = None,
        *,
        single_statement: bool = False,
    ) -> tuple[T | None, list[EventRecord]]:
        """An atomic commit: every lease of `batch` must hold (else `LeaseLost`, nothing
        stored), then `work`, then the events, then `announce` of them, in one transaction.
        `single_statement`: `work` is one statement, so with no events it is a commit of its
        own, without a `BEGIN` and a `COMMIT` where the backend has one."""
        return await self.write(
            partial(commit_in, batch=list(batch), work=work, announce=announce),
            single_statement=single_statement and not batch and self.backend == "postgresql",
            log_writer=True,
        )

    async def commit_parts(self, parts: Sequence[Part]) -> list[PartStored | Exception]:
        """Several commits in one transaction, each all or nothing on its own: a part's
        outcome is what `append` or `commit` would have returned, or the exception it raised
        (nothing of that part stored). `PartsAborted` or `StorageUnavailable` when the
        transaction as a whole failed; after `PartsAborted` nothing of any part was stored."""
        return await self.write(partial(commit_parts_in, parts=list(parts)), log_writer=True)

    async def read_events(self, thread_id: str, *, after_seq: int, limit: int) -> list[EventRecord]:
        """A replay page: the thread's events after `after_seq`, in order, at most `limit`."""
        return await self.read(
            partial(read_in, thread_id=thread_id, after_seq=after_seq, limit=limit), bulk=True
        )

    async def ping(self) -> None:
        """Raises `StorageUnavailable` unless the database answers."""
        await self.read(lambda conn: conn.execute(_SELECT_ONE).scalar())


class Part(NamedTuple):
    """One of several commits stored in one transaction (`commit_parts_in`): streamed events
    (`atomic` false: stored where their lease holds, as `append_fenced_in`) or an atomic
    commit (`commit_in`: every lease holds, then `work`, then the events)."""

    batch: list[NewEvent]
    work: Callable[[Connection], Any] | None
    announce: Announce | None
    atomic: bool


class PartStored(NamedTuple):
    result: Any
    records: list[EventRecord]
    lost: set[Lease]


class PartsAborted(CodedError):
    """A part failed with the database rather than on its own (an outage, a deadlock), or its
    savepoint could not be rolled back: the transaction is rolled back and nothing of any part
    is stored."""


# The name of every part's savepoint: each is released as the next begins, so one name
# serves all; the last one is released by the transaction's COMMIT.
_SAVEPOINT = "gateway_part"
_FIRST_PART = (f"SAVEPOINT {_SAVEPOINT}",)
_NEXT_PART = (f"RELEASE SAVEPOINT {_SAVEPOINT}", f"SAVEPOINT {_SAVEPOINT}")


def commit_parts_in(conn: Connection, parts: Sequence[Part]) -> list[PartStored | Exception]:
    """Each part in order, in a savepoint of its own: a part that raises (a lost lease, a
    stale write, a vanished thread) is rolled back alone and its exception takes its place
    in the result; the others commit with the transaction. One transaction for many commits
    is one WAL flush instead of one each (PostgreSQL's `COMMIT` waits for its fsync). On
    PostgreSQL, a part's savepoint costs one round trip (releasing the one before with it),
    where it cost two: under load, each is a turn of the loop for the event log's writer."""
    outcomes: list[PartStored | Exception] = []
    for position, part in enumerate(parts):
        run_statements(conn, _NEXT_PART if position else _FIRST_PART)
        try:
            if part.atomic:
                result, records = commit_in(conn, part.batch, part.work, part.announce)
                stored = PartStored(result, records, set())
            else:
                records, lost = append_fenced_in(conn, part.batch, part.announce)
                stored = PartStored(None, records, lost)
        except Exception as exc:
            if as_storage_error(exc) is not exc:
                # The database failed, not the part: whatever it was, the transaction ends
                # here and every part is committed alone, in order.
                raise PartsAborted() from exc
            try:
                # The savepoint stays, empty, until the next part's or the COMMIT releases it.
                conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            except Exception as failed:
                raise PartsAborted() from failed
            outcomes.append(exc)
            continue
        outcomes.append(stored)
    return outcomes


@contextmanager
def storage_errors() -> Iterator[None]:
    """Database failures as `StorageUnavailable`; integrity errors (programming or race
    signals, not outages) and everything else pass through unchanged."""
    try:
        yield
    except Exception as exc:
        error = as_storage_error(exc)
        if error is exc:
            raise
        raise error from exc


def as_storage_error(exc: Exception) -> Exception:
    """What `storage_errors` raises for `exc`."""
    if isinstance(exc, IntegrityError) or not isinstance(
        exc, OperationalError | InterfaceError | DBAPIError | OSError
    ):
        return exc
    error = StorageUnavailable(f"storage unavailable: {type(exc).__name__}")
    error.__cause__ = exc
    return error
