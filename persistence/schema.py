"""Schema migrations (Alembic): run at start-up, by `python -m gateway migrate`, or by Alembic's
own command line on `persistence/alembic.ini`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from persistence.store import DatabaseConfigError

if TYPE_CHECKING:
    from persistence.store import Store

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
ALEMBIC_INI = Path(__file__).with_name("alembic.ini")
# The database of a gateway started without GATEWAY_DATABASE_URL (and of the Alembic command
# line without it).
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./gateway.db"


@dataclass(frozen=True)
class SchemaRevision:
    current: str | None  # None: an empty database
    head: str

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head


class SchemaBehind(DatabaseConfigError):
    """Migrations are off at start-up and the database is not at this gateway's revision."""


def alembic_config(connection: Connection) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def _quiet_alembic() -> None:
    # Alembic narrates every plugin (as it is first imported) and revision at INFO; the gateway
    # logs the outcome itself. Before any import of alembic's.
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _upgrade(connection: Connection, target: str) -> None:
    _quiet_alembic()
    from alembic import command

    command.upgrade(alembic_config(connection), target)


def _downgrade(connection: Connection, target: str) -> None:
    _quiet_alembic()
    from alembic import command

    command.downgrade(alembic_config(connection), target)


def head_revision() -> str:
    """The newest revision of the shipped migrations: this gateway's."""
    _quiet_alembic()
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None  # the chain of shipped migrations is never empty
    return head


def _revision(connection: Connection) -> SchemaRevision:
    _quiet_alembic()
    from alembic.runtime.migration import MigrationContext

    return SchemaRevision(
        MigrationContext.configure(connection).get_current_revision(), head_revision()
    )


async def migrate(store: Store, target: str = "head") -> None:
    """Create the schema or bring it to `target` (the newest revision by default; idempotent)."""
    async with store.engine.begin() as connection:
        await connection.run_sync(_upgrade, target)


async def downgrade(store: Store, target: str) -> None:
    """Take the schema back to the revision `target` (each migration has its downgrade)."""
    async with store.engine.begin() as connection:
        await connection.run_sync(_downgrade, target)


async def revision(store: Store) -> SchemaRevision:
    async with store.engine.connect() as connection:
        return await connection.run_sync(_revision)


async def require_current(store: Store) -> None:
    """Refuse a schema that is not this gateway's revision (for a start-up without migrations):
    serving it would fail at the first statement that needs a newer column or table."""
    found = await revision(store)
    if not found.up_to_date:
        raise SchemaBehind(
            f"the database schema is at revision {found.current or '(none: empty database)'} "
            f"and this gateway needs {found.head}; migrations at start-up are off "
            "(GATEWAY_MIGRATE=false): run `python -m gateway migrate` first"
        )
