"""Alembic environment: runs on the connection the gateway hands over at start-up.

`persistence.db.migrate` opens the connection on the application's own engine and passes it in
`config.attributes["connection"]`, so migrations use the same URL, driver and pragmas as the app.
"""

from __future__ import annotations

from alembic import context

from persistence.tables import metadata

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
    context.run_migrations()
