"""Schema migrations (Alembic), run at start-up or by `python -m gateway migrate`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from persistence.store import Store

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def alembic_config(connection: Connection) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    # Alembic narrates every plugin and revision at INFO; the gateway logs the outcome itself.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from alembic import command

    command.upgrade(alembic_config(connection), "head")


async def migrate(store: Store) -> None:
    """Create the schema or bring it to the newest revision (idempotent)."""
    async with store.engine.begin() as connection:
        await connection.run_sync(_upgrade)
