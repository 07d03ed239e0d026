"""Alembic environment: runs on the connection the gateway hands over at start-up.

`persistence.db.migrate` opens the connection on the application's own engine and passes it in
`config.attributes["connection"]`, so migrations use the same URL, driver and pragmas as the app.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from persistence.tables import metadata

# Key of the PostgreSQL advisory lock that serialises migrations ("gateway" in ASCII).
MIGRATION_LOCK_KEY = 0x67617465776179

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "run migrations through persistence.db.migrate (or `python -m gateway migrate`)"
    )

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    if connection.dialect.name == "postgresql":
        # Several gateway processes may start (and migrate) at once. Without this they race:
        # each reads the same alembic_version, runs the same DDL, and all but one fail (e.g. a
        # duplicate-key error on pg_type for CREATE TABLE). The lock is transaction-scoped, so it
        # is held until the revision is committed; a waiter then reads the new alembic_version
        # (READ COMMITTED) and has nothing left to do. SQLite is left as it was.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    context.run_migrations()
