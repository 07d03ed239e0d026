"""Choosing the store for a database URL. Apart from `persistence/store.py`, which the backends
build on, so that the base module never imports its own backends."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

from persistence.store import DatabaseConfigError, Store


def open_store(url: str | URL) -> Store:
    """The store for a database URL: `sqlite:///path` (also `sqlite+aiosqlite:`) or
    `postgresql://...` (also `postgresql+asyncpg:`, `postgres:`)."""
    parsed = make_url(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        from persistence.sqlite.store import SqliteStore

        return SqliteStore(parsed)
    if backend in {"postgresql", "postgres"}:
        from persistence.postgres.store import PostgresStore

        return PostgresStore(parsed)
    raise DatabaseConfigError(
        f"unsupported database {parsed.drivername!r}: use sqlite:///path/to/gateway.db or "
        "postgresql://user@host/dbname"
    )
