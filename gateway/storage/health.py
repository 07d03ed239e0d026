"""Storage health as operators see it: `/readyz`, one ERROR line when storage fails and one
INFO line when it is back.

Every store operation goes through `ReportingStore`, which tells `StorageHealth` of each one
that failed with `StorageUnavailable`. The first failure marks storage unhealthy and is logged
once, with its cause (the database's own message, never the statement or its parameters);
`/readyz` then answers 503 with that reason. While unhealthy, a cheap write (`probe_in`) is
tried every `probe_every_s`; once one succeeds with no other failure reported meanwhile,
storage is healthy again and that is logged once. The places that meet a failure answer their
caller (`unavailable`) without logging a traceback of their own.

A damaged database file (SQLite reports its image malformed, or the integrity check found
problems at start-up) does not heal by itself: it stays unhealthy until restored and restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.observability.log_fields import unbound_context
from gateway.protocol.error_codes import CodedError

# Re-exported: also the name the transports catch, so that they need not import persistence.
from persistence.errors import StorageUnavailable as StorageUnavailable
from persistence.store import Store, Work

T = TypeVar("T")

log = logging.getLogger("gateway.storage")

# Longest cause quoted in the log and in /readyz.
MAX_REASON_CHARS = 200
_DAMAGED_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
# After a full disk, storage counts as back only with this much free space beside a SQLite
# file: the probe's one-page write can fit where a stream of events would not (SQLite reuses
# the space of its write-ahead log), and health would flap between failed and back.
MIN_FREE_BYTES = 1024 * 1024
# A write that changes nothing but must reach the database file (or server) to succeed.
_PROBE = text("UPDATE alembic_version SET version_num = version_num")
# How many problems of the integrity check are quoted.
MAX_PROBLEMS_QUOTED = 3


class DamagedDatabase(CodedError, RuntimeError):
    """The database file failed the integrity check at start-up."""


def describe(error: BaseException) -> str:
    """The cause of a storage failure in the database's own words: the driver's message
    (SQLite's and PostgreSQL's carry no row data), never SQLAlchemy's, which quotes the
    statement and its parameters."""
    cause: BaseException = error
    while True:
        inner = getattr(cause, "orig", None) or cause.__cause__
        if inner is None or inner is cause:
            break
        cause = inner
    message = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    described = f"{type(cause).__name__}: {message}" if message else type(cause).__name__
    return described[:MAX_REASON_CHARS]


def _sqlite_code(error: BaseException) -> int | None:
    """The primary SQLite result code in `error`'s causes, if any."""
    cause: BaseException | None = error
    while cause is not None:
        code = getattr(cause, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF
        cause = getattr(cause, "orig", None) or cause.__cause__
    return None


def is_damage(error: BaseException) -> bool:
    return _sqlite_code(error) in _DAMAGED_CODES


def is_full(error: BaseException) -> bool:
    return _sqlite_code(error) == sqlite3.SQLITE_FULL


def is_outage(error: BaseException) -> bool:
    """A storage failure rather than a bug: `StorageUnavailable`, or a driver error from code
    that reaches the database beside the store (the SDK's session); integrity errors are
    programming or race signals, not outages."""
    if isinstance(error, StorageUnavailable):
        return True
    return isinstance(error, DBAPIError) and not isinstance(error, IntegrityError)


def log_failure(logger: logging.Logger, error: BaseException, message: str, *args: object) -> None:
    """A background operation failed: an outage as one WARNING line with its cause (the
    storage health has logged the outage itself, once), anything else at ERROR with its
    traceback."""
    if is_outage(error):
        logger.warning(message + ": storage unavailable (%s)", *args, describe(error))
    else:
        logger.error(message, *args, exc_info=error)


def probe_in(conn: Connection) -> None:
    conn.execute(_PROBE)


class StorageHealth:
    def __init__(self, store: Store, *, probe_every_s: float) -> None:
        """`store`: the backend's own store, which the probe writes to."""
        self._store = store
        self._probe_every_s = probe_every_s
        self._reason: str | None = None
        self._damaged = False
        self._full = False
        self._failed_at = 0.0
        # Set by every reported failure; a probe counts only if none came during it.
        self._failed_since_probe = False
        self._probing: asyncio.Task[None] | None = None

    @property
    def reason(self) -> str | None:
        """Why storage is unhealthy; None while it is healthy."""
        return self._reason

    @property
    def disk_full(self) -> bool:
        """A write failed for want of disk space and too little has been freed since. Writes
        are refused meanwhile: SQLite reuses the space of its write-ahead log, so a small write
        may still fit, and a run accepted that way would stop at its first few events."""
        return self._reason is not None and self._full

    def failed(self, error: BaseException) -> None:
        self._failed_since_probe = True
        self._full = self._full or is_full(error)
        damaged = is_damage(error)
        if self._reason is not None and not (damaged and not self._damaged):
            return
        self._reason = describe(error)
        if damaged:
            self._damaged = True
            self._reason = f"the database file is damaged ({self._reason})"
        self._failed_at = time.monotonic()
        log.error(
            "storage failed: %s; clients get `unavailable` and /readyz answers 503 until %s",
            self._reason,
            "the database is restored" if damaged else "it is back",
        )
        self._start_probing()

    def damaged(self, problems: Sequence[str]) -> None:
        """The integrity check found `problems` and the gateway starts anyway."""
        self._damaged = True
        quoted = "; ".join(problems[:MAX_PROBLEMS_QUOTED])
        self._reason = f"the database file is damaged ({quoted})"[:MAX_REASON_CHARS]
        log.error("storage damaged: %s; /readyz answers 503", self._reason)

    async def check(self) -> None:
        """One probe now (at start-up): a database that cannot be written shows at once."""
        try:
            await self._store.write(probe_in)
        except StorageUnavailable as exc:
            self.failed(exc)

    async def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probing
            self._probing = None

    def _start_probing(self) -> None:
        if self._damaged or (self._probing is not None and not self._probing.done()):
            return
        # Started by whichever request or run first met the outage; probes for everyone.
        self._probing = asyncio.get_running_loop().create_task(
            self._probe_until_back(), name="storage-probe", context=unbound_context()
        )

    async def _probe_until_back(self) -> None:
        while self._reason is not None and not self._damaged:
            await asyncio.sleep(self._probe_every_s)
            self._failed_since_probe = False
            try:
                await self._store.write(probe_in)
            except StorageUnavailable as exc:
                self.failed(exc)
                continue
            except Exception as exc:
                # Not an outage (a missing table, a bug): keep probing, say why once.
                log.warning("storage probe failed: %s", describe(exc))
                continue
            if self._failed_since_probe or self._damaged or not self._room_to_write():
                continue
            log.info(
                "storage is back after %.0f s (it failed with: %s)",
                time.monotonic() - self._failed_at,
                self._reason,
            )
            self._reason = None
            self._full = False

    def _room_to_write(self) -> bool:
        if not self._full or self._store.backend != "sqlite" or not self._store.url.database:
            return True
        folder = Path(self._store.url.database).expanduser().resolve().parent
        try:
            return shutil.disk_usage(folder).free >= MIN_FREE_BYTES
        except OSError:
            return False


def refuse_damaged(problems: Sequence[str]) -> DamagedDatabase:
    """The error that stops start-up (logged as one line where start-up is refused)."""
    quoted = "; ".join(problems[:MAX_PROBLEMS_QUOTED])
    message = (
        f"the database file fails SQLite's integrity check ({quoted}); restore it from a "
        "backup, or set GATEWAY_ALLOW_DAMAGED_DATABASE=true to start anyway"
    )
    return DamagedDatabase(message)


async def integrity_problems(store: Store) -> list[str]:
    """SQLite's quick check of the database file (every page and index entry, not the
    cross-checks of a full integrity check); nothing to check on other backends."""
    if store.backend != "sqlite":
        return []

    def check(conn: Connection) -> list[str]:
        return [str(row[0]) for row in conn.exec_driver_sql("PRAGMA quick_check")]

    try:
        rows = await store.read(check, bulk=True)
    except StorageUnavailable as exc:
        return [describe(exc)]
    return [] if rows == ["ok"] else rows


class ReportingStore(Store):
    """`inner`, with every `StorageUnavailable` reported to `health` on its way out, and no
    write attempted while the disk is full."""

    def __init__(self, inner: Store, health: StorageHealth) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self._health = health

    @property
    def engine(self) -> AsyncEngine:
        return self.inner.engine

    def statement_engines(self) -> Sequence[Engine]:
        return self.inner.statement_engines()

    async def write(
        self,
        work: Work[T],
        *,
        slow: bool = False,
        single_statement: bool = False,
        log_writer: bool = False,
    ) -> T:
        if self._health.disk_full:
            # Not reported: only the probe's writes (on `inner`) decide when storage is back.
            raise StorageUnavailable(
                f"storage unavailable: the disk is full ({self._health.reason})"
            )
        try:
            return await self.inner.write(
                work, slow=slow, single_statement=single_statement, log_writer=log_writer
            )
        except StorageUnavailable as exc:
            self._health.failed(exc)
            raise

    async def read(self, work: Work[T], *, bulk: bool = False) -> T:
        try:
            return await self.inner.read(work, bulk=bulk)
        except StorageUnavailable as exc:
            self._health.failed(exc)
            raise

    async def close(self) -> None:
        await self.inner.close()
