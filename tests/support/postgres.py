"""A PostgreSQL database of a test's own on the machine's server, dropped when it ends.

The server is `GATEWAY_TEST_POSTGRES_URL` (default postgresql://postgres@127.0.0.1:5432/postgres,
the maintenance database used to create and drop the test's). Without a reachable server the
test skips, or fails under GATEWAY_REQUIRE_SERVICES=1 (CI).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.engine import make_url

from tests.conftest import require_service
from tests.support.workers import worker_id

SERVER_URL = os.environ.get(
    "GATEWAY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _server() -> tuple[str, int]:
    url = make_url(SERVER_URL)
    return url.host or "127.0.0.1", url.port or 5432


def require_postgres() -> None:
    host, port = _server()
    require_service("PostgreSQL", host, port)


@asynccontextmanager
async def postgres_database(prefix: str = "gw_test") -> AsyncIterator[str]:
    """The URL of a new, empty database; dropped (connections and all) afterwards. Its name
    carries the worker's (tests/support/workers.py), so workers never meet in one, and a
    database left by a killed run says whose it was."""
    require_postgres()
    import asyncpg

    admin = make_url(SERVER_URL)
    name = f"{prefix}_{worker_id()}_{secrets.token_hex(6)}"
    dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield admin.set(drivername="postgresql+asyncpg", database=name).render_as_string(
            hide_password=False
        )
    finally:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
