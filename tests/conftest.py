"""Shared fixtures. Tests needing an external service use `require_service`."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

REQUIRE_SERVICES = os.environ.get("GATEWAY_REQUIRE_SERVICES") == "1"


def require_service(name: str, host: str, port: int) -> None:
    """Skip when the service is absent, unless GATEWAY_REQUIRE_SERVICES=1 (CI): then fail."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return
    except OSError:
        message = f"{name} is not reachable on {host}:{port}"
        if REQUIRE_SERVICES:
            pytest.fail(message + " (GATEWAY_REQUIRE_SERVICES=1)")
        pytest.skip(message)


BACKENDS = ("sqlite", "postgresql")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_backends: run the test on SQLite and on PostgreSQL (the `database_url` fixture)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked `both_backends` that use `database_url` run once per backend; others get
    the SQLite file."""
    if "database_url" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "both_backends"
    ):
        metafunc.parametrize("database_url", BACKENDS, indirect=True)


@pytest.fixture
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The test's own database: a SQLite file in its folder, or a PostgreSQL database created
    for it and dropped afterwards."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'gateway.db'}"
        return
    from tests.support.postgres import postgres_database

    async with postgres_database() as url:
        yield url
