"""The audit trail: who did what, to which target, when, from where, and with what outcome.

Entries are only ever inserted and read; retention of run data never touches this table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import CTE, Column, Insert, String, bindparam, insert, select
from sqlalchemy.engine import Connection, RowMapping

from persistence.clock import as_utc, utcnow
from persistence.prepared import Prepared
from persistence.tables import audit

if TYPE_CHECKING:
    from persistence.store import Store

MAX_PAGE = 500


@dataclass(frozen=True)
class AuditEntry:
    """One entry to record. `details` must be JSON-serialisable and hold no secrets."""

    action: str
    outcome: str
    tenant: str | None = None
    actor: str | None = None
    target: str | None = None
    source: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    at: datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class AuditRecord:
    audit_id: int
    at: datetime
    tenant: str | None
    actor: str | None
    action: str
    outcome: str
    target: str | None
    source: str | None
    details: dict[str, Any]

    @classmethod
    def from_row(cls, row: RowMapping) -> AuditRecord:
        return cls(
            audit_id=int(row["audit_id"]),
            at=as_utc(row["at"]) or utcnow(),
            tenant=row["tenant"],
            actor=row["actor"],
            action=row["action"],
            outcome=row["outcome"],
            target=row["target"],
            source=row["source"],
            details=row["details"] if isinstance(row["details"], dict) else {},
        )


@dataclass(frozen=True)
class AuditQuery:
    """Filters of one page of a tenant's audit trail; `None` means "any"."""

    tenant: str
    action: str | None = None
    actor: str | None = None
    target: str | None = None
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive
    after_id: int = 0
    limit: int = 100


def _bounded(value: str | None, column: Column[Any]) -> str | None:
    # Values come from tokens, paths and frames (a `sub` may be 256 characters): clipped to the
    # column so a long value is still recorded rather than failing the insert on strict backends.
    length = column.type.length if isinstance(column.type, String) else None
    if value is None or length is None or len(value) <= length:
        return value
    return value[:length]


def _row(entry: AuditEntry) -> dict[str, Any]:
    c = audit.c
    return {
        "at": entry.at,
        "tenant": _bounded(entry.tenant, c.tenant),
        "actor": _bounded(entry.actor, c.actor),
        "action": _bounded(entry.action, c.action),
        "outcome": _bounded(entry.outcome, c.outcome),
        "target": _bounded(entry.target, c.target),
        "source": _bounded(entry.source, c.source),
        "details": entry.details,
    }


def _utc(moment: datetime) -> datetime:
    # SQLite stores datetimes without an offset; every stored `at` is UTC, so compare in UTC.
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


_KEYS = ["at", "tenant", "actor", "action", "outcome", "target", "source", "details"]
_INSERT = Prepared(insert(audit), keys=_KEYS)


class AuditRepository:
    def __init__(self, store: Store) -> None:
        self._store = store

    @staticmethod
    def insert_in(conn: Connection, entries: AuditEntry | Sequence[AuditEntry]) -> None:
        """Insert inside the caller's transaction, so the entry commits with what it records."""
        batch = [entries] if isinstance(entries, AuditEntry) else list(entries)
        _INSERT.many(conn, [_row(entry) for entry in batch])

    @staticmethod
    def inserted_for(source: CTE) -> Insert:
        """An entry (its values `params(entry)`) inserted once for each row of `source`: the
        entry recorded in the statement that makes what it records, only if that made
        anything."""
        columns = [audit.c[key] for key in _KEYS]
        values = select(
            *(bindparam(f"b_audit_{column.name}", type_=column.type) for column in columns)
        ).select_from(source)
        return insert(audit).from_select(_KEYS, values)

    @staticmethod
    def params(entry: AuditEntry) -> dict[str, Any]:
        """The parameters of `inserted_for`'s statement for `entry`."""
        return {f"b_audit_{key}": value for key, value in _row(entry).items()}

    async def insert(self, entries: AuditEntry | Sequence[AuditEntry]) -> None:
        await self._store.write(partial(self.insert_in, entries=entries))

    async def list_entries(self, query: AuditQuery) -> tuple[list[AuditRecord], int | None]:
        """One page, oldest first, and the `after_id` of the next page (None when none is left)."""
        c = audit.c
        limit = max(1, min(query.limit, MAX_PAGE))
        statement = select(audit).where(c.tenant == query.tenant, c.audit_id > query.after_id)
        if query.action is not None:
            statement = statement.where(c.action == query.action)
        if query.actor is not None:
            statement = statement.where(c.actor == query.actor)
        if query.target is not None:
            statement = statement.where(c.target == query.target)
        if query.since is not None:
            statement = statement.where(c.at >= _utc(query.since))
        if query.until is not None:
            statement = statement.where(c.at < _utc(query.until))
        # One row more than asked tells whether another page exists without a count query.
        statement = statement.order_by(c.audit_id).limit(limit + 1)
        rows = await self._store.read(lambda conn: conn.execute(statement).mappings().all())
        records = [AuditRecord.from_row(row) for row in rows[:limit]]
        next_after_id = records[-1].audit_id if len(rows) > limit else None
        return records, next_after_id
