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

from persistence.schema import ALEMBIC_INI, head_revision
from tests.support.fork_server import run_gateway_command
from tests.support.gateway import ROOT, spawn_gateway

pytestmark = pytest.mark.both_backends
ALEMBIC = Path(sys.executable).with_name("alembic")
HEAD = head_revision()


def command(database_url: str, *argv: str, status: int = 0) -> str:
    """Run a command with the gateway's database URL in its environment; its output."""
    env = {**os.environ, "GATEWAY_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == status, done.stdout + done.stderr
    return done.stdout + done.stderr


def gateway_cli(database_url: str, *argv: str, status: int = 0) -> str:
    """`python -m gateway migrate ARGV` (tests/support/fork_server.py); its output."""
    env = {**os.environ, "GATEWAY_DATABASE_URL": database_url}
    done = run_gateway_command(["migrate", *argv], env=env, cwd=ROOT)
    assert done.returncode == status, done.stdout + done.stderr
    return done.stdout + done.stderr


def alembic(database_url: str, *argv: str) -> str:
    return command(database_url, str(ALEMBIC), "-c", str(ALEMBIC_INI), *argv)


def test_the_schema_is_migrated_shown_and_taken_back_by_either_command_line(
    database_url: str,
) -> None:
    # Behind: said, and exit status 1, so a deployment script can tell.
    behind = gateway_cli(database_url, "--current", status=1)
    assert f"revision (none), newest {HEAD}: behind" in behind
    alembic(database_url, "upgrade", "head")
    assert f"{HEAD} (head)" in alembic(database_url, "current")
    assert "up to date" in gateway_cli(database_url, "--current")

    assert "taken back to 0005" in gateway_cli(database_url, "--downgrade", "0005")
    assert "0005" in alembic(database_url, "current")
    assert "(head)" not in alembic(database_url, "current")

    alembic(database_url, "downgrade", "0004")
    assert "revision 0004" in gateway_cli(database_url, "--current", status=1)
    assert f"schema upgraded from revision 0004 to {HEAD}" in gateway_cli(database_url)
    assert f"{HEAD} (head)" in alembic(database_url, "current")
    assert f"already at the newest revision, {HEAD}: nothing to do" in gateway_cli(database_url)


def test_migrate_on_an_empty_database_says_it_created_the_schema(database_url: str) -> None:
    assert f"schema created at revision {HEAD}" in gateway_cli(database_url)


def test_without_migrations_at_start_up_only_the_current_revision_is_served(
    database_url: str, tmp_path: Path
) -> None:
    env = {"GATEWAY_DATABASE_URL": database_url, "GATEWAY_MIGRATE": "false"}
    with pytest.raises(RuntimeError) as empty:
        spawn_gateway(tmp_path, env=env)
    assert f"schema is at revision (none: empty database) and this gateway needs {HEAD}" in str(
        empty.value
    )
    assert_one_refusal(str(empty.value))
    # Refusing changed nothing: the database is still empty.
    assert "revision (none)" in gateway_cli(database_url, "--current", status=1)

    alembic(database_url, "upgrade", "0005")
    with pytest.raises(RuntimeError) as behind:
        spawn_gateway(tmp_path, env=env)
    assert f"schema is at revision 0005 and this gateway needs {HEAD}" in str(behind.value)
    assert "GATEWAY_MIGRATE=false" in str(behind.value)
    assert_one_refusal(str(behind.value))

    gateway_cli(database_url)
    gateway = spawn_gateway(tmp_path, env=env)
    try:
        assert httpx.get(f"http://127.0.0.1:{gateway.port}/readyz", timeout=10).status_code == 200
    finally:
        gateway.terminate()


def assert_one_refusal(output: str) -> None:
    """The refusal is one error line: no traceback, no second line saying it again."""
    assert [line for line in output.splitlines() if "not starting" in line] != []
    assert len([line for line in output.splitlines() if "ERROR" in line]) == 1, output
    assert "Traceback" not in output and "Application startup failed" not in output, output


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_workers_without_migrations_migrate_nothing_and_refuse_in_one_line(
    database_url: str, tmp_path: Path, how: str
) -> None:
    env = {
        **os.environ,
        "GATEWAY_DATABASE_URL": database_url,
        "PYTHONPATH": str(ROOT),
        "GATEWAY_SECRET": "s" * 64,
    }
    args = ["serve", "--workers", "2", "--port", "0"]
    if how == "flag":
        args.append("--no-migrate")
    else:
        env["GATEWAY_MIGRATE"] = "false"
    done = run_gateway_command(args, env=env, cwd=ROOT, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"schema is at revision (none: empty database) and this gateway needs {HEAD}" in output
    assert_one_refusal(output)
    assert "worker 0 started" not in output
    # Nothing was migrated: the database is still empty.
    assert "revision (none)" in gateway_cli(database_url, "--current", status=1)
