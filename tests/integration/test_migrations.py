"""Migrations as a deployment step: `python -m gateway migrate` (upgrade, --current,
--downgrade), Alembic's own command line on persistence/alembic.ini with the gateway's database
URL, and a gateway started with GATEWAY_MIGRATE=false refusing any other revision."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from persistence.schema import ALEMBIC_INI
from tests.support.gateway import ROOT, spawn_gateway

pytestmark = pytest.mark.both_backends
ALEMBIC = Path(sys.executable).with_name("alembic")
HEAD = "0010"


def command(database_url: str, *argv: str) -> str:
    """Run a command with the gateway's database URL in its environment; its output."""
    env = {**os.environ, "GATEWAY_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def gateway_cli(database_url: str, *argv: str) -> str:
    return command(database_url, sys.executable, "-m", "gateway", "migrate", *argv)


def alembic(database_url: str, *argv: str) -> str:
    return command(database_url, str(ALEMBIC), "-c", str(ALEMBIC_INI), *argv)


def test_the_schema_is_migrated_shown_and_taken_back_by_either_command_line(
    database_url: str,
) -> None:
    assert f"revision (none), newest {HEAD}: behind" in gateway_cli(database_url, "--current")
    alembic(database_url, "upgrade", "head")
    assert f"{HEAD} (head)" in alembic(database_url, "current")
    assert "up to date" in gateway_cli(database_url, "--current")

    assert "taken back to 0005" in gateway_cli(database_url, "--downgrade", "0005")
    assert "0005" in alembic(database_url, "current")
    assert "(head)" not in alembic(database_url, "current")

    alembic(database_url, "downgrade", "0004")
    assert "revision 0004" in gateway_cli(database_url, "--current")
    assert "schema is up to date" in gateway_cli(database_url)
    assert f"{HEAD} (head)" in alembic(database_url, "current")


def test_without_migrations_at_start_up_only_the_current_revision_is_served(
    database_url: str, tmp_path: Path
) -> None:
    env = {"GATEWAY_DATABASE_URL": database_url, "GATEWAY_MIGRATE": "false"}
    with pytest.raises(RuntimeError) as empty:
        spawn_gateway(tmp_path, env=env)
    assert f"schema is at revision (none: empty database) and this gateway needs {HEAD}" in str(
        empty.value
    )
    # Refusing changed nothing: the database is still empty.
    assert "revision (none)" in gateway_cli(database_url, "--current")

    alembic(database_url, "upgrade", "0005")
    with pytest.raises(RuntimeError) as behind:
        spawn_gateway(tmp_path, env=env)
    assert f"schema is at revision 0005 and this gateway needs {HEAD}" in str(behind.value)
    assert "GATEWAY_MIGRATE=false" in str(behind.value)

    gateway_cli(database_url)
    gateway = spawn_gateway(tmp_path, env=env)
    try:
        assert httpx.get(f"http://127.0.0.1:{gateway.port}/readyz", timeout=10).status_code == 200
    finally:
        gateway.terminate()
