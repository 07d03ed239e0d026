"""The operator's command line pointed at files that are not gateway databases, or that it may
only read: it refuses with one line and leaves each file exactly as it was (no switch to WAL, no
empty database made of an empty file), and reads a database it cannot write."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.gateway import ROOT


def gateway_cli(
    *args: str, database: Path, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GATEWAY_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args, "--database-url", f"sqlite:///{database}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        user=user,
    )


def unprivileged_user() -> str:
    """`nobody`, when it can run the gateway from this checkout; else the test is skipped (a
    checkout inside a folder only its owner may enter, as `mktemp -d` makes them)."""
    try:
        user = pwd.getpwnam("nobody").pw_name
    except KeyError:
        pytest.skip("no unprivileged user to read the database as")
    try:
        ran = subprocess.run(
            [sys.executable, "-c", "import gateway"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            timeout=60,
            user=user,
        )
    except PermissionError:
        ran = None
    if ran is None or ran.returncode != 0:
        pytest.skip(f"{user} cannot run the gateway from {ROOT} (a folder only its owner enters)")
    return user


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file of `folder` and its content's digest."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.iterdir()}


def one_line(stderr: str, code: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error ({code}): "), stderr


@pytest.mark.parametrize(
    "command", [("runs", "list"), ("approvals", "list"), ("runs", "cancel", "r_x")]
)
def test_a_file_that_is_not_a_gateway_database_is_refused_unchanged(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    before = fingerprint(tmp_path)
    result = gateway_cli(*command, database=other)
    assert result.returncode == 6, result
    one_line(result.stderr, "schema_not_current")
    assert fingerprint(tmp_path) == before
    with sqlite3.connect(other) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_an_empty_file_stays_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    result = gateway_cli("runs", "list", database=empty)
    assert result.returncode == 6, result
    one_line(result.stderr, "schema_not_current")
    assert empty.stat().st_size == 0
    assert [path.name for path in tmp_path.iterdir()] == ["empty.db"]


def test_a_file_that_is_not_sqlite_is_one_line(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database, " * 400)
    before = fingerprint(tmp_path)
    result = gateway_cli("runs", "list", database=garbage)
    assert result.returncode == 5, result
    one_line(result.stderr, "unavailable")
    assert "file is not a database" in result.stderr
    assert fingerprint(tmp_path) == before


def test_a_database_that_can_only_be_read_is_read(tmp_path: Path) -> None:
    # Root may write anything: the commands run as an unprivileged user then, on a folder of
    # their own under the system's temporary folder (pytest keeps its own private).
    user = None
    base = tmp_path
    if os.geteuid() == 0:
        user = unprivileged_user()
        base = Path(tempfile.mkdtemp(prefix="gateway-readonly-"))
        base.chmod(0o755)
    folder = base / "readonly"
    folder.mkdir()
    database = folder / "gateway.db"
    try:
        created = gateway_cli("migrate", database=database)
        assert created.returncode == 0, created
        before = fingerprint(folder)
        database.chmod(0o444)
        folder.chmod(0o555)
        for command in (("runs", "list"), ("approvals", "list"), ("runs", "show", "r_x")):
            result = gateway_cli(*command, database=database, user=user)
            expected = 3 if command[1] == "show" else 0
            assert result.returncode == expected, (command, result.stderr[-1500:])
        assert fingerprint(folder) == before
    finally:
        folder.chmod(0o755)
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)
