"""Alembic environment: runs on the connection the gateway hands over, or opens the store itself.

The gateway (`persistence.schema`, at start-up or `python -m gateway migrate`) opens a
connection on the application's own engine and passes it in `config.attributes["connection"]`,
so migrations use the same URL, driver and pragmas as the app. Run by Alembic's command line
(`alembic -c persistence/alembic.ini ...`), it opens the same store from `-x database_url=...`
or GATEWAY_DATABASE_URL.
"""

from __future__ import annotations

import asyncio
import logging.config
import os

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from persistence.schema import DEFAULT_DATABASE_URL
from persistence.tables import metadata

# Key of the PostgreSQL advisory lock that serialises migrations ("gateway" in ASCII).
MIGRATION_LOCK_KEY = 0x67617465776179


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Several gateway processes may start (and migrate) at once. Without this they
            # race: each reads the same alembic_version, runs the same DDL, and all but one fail
            # (e.g. a duplicate-key error on pg_type for CREATE TABLE). The lock is
            # transaction-scoped, so it is held until the revision is committed; a waiter then
            # reads the new alembic_version (READ COMMITTED) and has nothing left to do.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        context.run_migrations()


async def run_on_own_store(url: str) -> None:
    from persistence.backends import open_store

    store = open_store(url)
    try:
        async with store.engine.begin() as connection:
            await connection.run_sync(run_on)
    finally:
        await store.close()


handed_over = context.config.attributes.get("connection")
if context.is_offline_mode():
    raise SystemExit("these migrations run on a live database only (no --sql)")
if handed_over is not None:
    run_on(handed_over)
else:
    if context.config.config_file_name is not None:
        logging.config.fileConfig(context.config.config_file_name, disable_existing_loggers=False)
    url = context.get_x_argument(as_dictionary=True).get("database_url") or os.environ.get(
        "GATEWAY_DATABASE_URL", DEFAULT_DATABASE_URL
    )
    asyncio.run(run_on_own_store(url))
