"""Storage that cannot be written, on real files: a read-only database file, a full disk, a
damaged page, a database server that goes away. Operators see each: `/readyz` answers 503
with the reason while it lasts and 200 once it is over, the log has one ERROR line when it
starts (the cause, never a statement or its values) and one INFO line when it ends, and no
traceback in between."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Connection

from gateway.auth.access import TokenVerifier
from gateway.storage.health import ReportingStore, StorageHealth, probe_in
from persistence.errors import StorageUnavailable
from persistence.sqlite import store as sqlite_store
from persistence.store import Work
from tests.support.client import Client, ProtocolFailure
from tests.support.disks import fill, immutable, small_tmpfs, writable_again
from tests.support.gateway import (
    TEST_SECRET,
    GatewayProcess,
    database_url,
    running_gateway,
)
from tests.support.gateway import (
    test_settings as settings_for,
)
from tests.support.hostile import eventually
from tests.support.storage import migrated_store

PROBE_S = 0.5
# Storage is back once a probe got through: a few probes, and a generous margin.
BACK_WITHIN_S = 10 * PROBE_S + 5
TOKENS = TokenVerifier(TEST_SECRET)
FAILED_LINE = "storage failed:"
BACK_LINE = "storage is back"


def env_for(db: Path, **extra: str) -> dict[str, str]:
    return {
        "GATEWAY_DATABASE_URL": database_url(db),
        "GATEWAY_STORAGE_PROBE_S": str(PROBE_S),
        **extra,
    }


async def readiness(gateway: GatewayProcess) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}", timeout=30) as http:
        response = await http.get("/readyz")
    return response.status_code, response.json()


async def ready_again(gateway: GatewayProcess) -> bool:
    deadline = asyncio.get_running_loop().time() + BACK_WITHIN_S
    while asyncio.get_running_loop().time() < deadline:
        if (await readiness(gateway))[0] == 200:
            return True
        await asyncio.sleep(0.2)
    return False


async def run_once(gateway: GatewayProcess, text: str = "hello there") -> dict[str, Any]:
    client = await Client.connect(gateway.ws_url, TOKENS.issue("alice", "acme", ["user"]))
    try:
        ack = await client.request("run.start", input=text)
        return await client.wait_for(
            lambda f: (
                f.get("event") in ("run.completed", "run.failed")
                and f.get("run_id") == ack["run_id"]
            ),
            timeout=30,
        )
    finally:
        await client.close()


async def refused_run(gateway: GatewayProcess) -> str | None:
    """A run start while storage fails: the error code, or None if it was accepted."""
    client = await Client.connect(gateway.ws_url, TOKENS.issue("alice", "acme", ["user"]))
    try:
        await client.request("run.start", input="hello there")
    except ProtocolFailure as failure:
        return failure.code
    finally:
        await client.close()
    return None


def assert_quiet(log: str, *, failures: int = 1, recoveries: int = 1) -> None:
    """One ERROR line (the failure), no traceback, no unretrieved exception."""
    errors = [line for line in log.splitlines() if " ERROR " in line or "ERROR:" in line]
    assert len(errors) == failures, "\n".join(errors) or log[-3000:]
    assert all(FAILED_LINE in line or "damaged" in line for line in errors), errors
    assert log.count(BACK_LINE) == recoveries, log[-3000:]
    assert "Traceback" not in log, log[-5000:]
    assert "never retrieved" not in log, log[-5000:]


async def test_a_read_only_database_file(
    spawn: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    db = tmp_path / "gateway.db"
    async with migrated_store(database_url(db)):
        pass
    with immutable(db):
        gateway = spawn(env=env_for(db))
        status, body = await readiness(gateway)
        assert status == 503, body
        assert "readonly" in body["reason"], body
        assert await refused_run(gateway) == "unavailable"
        writable_again(db)
        assert await ready_again(gateway), gateway.log()[-3000:]
    assert (await run_once(gateway))["event"] == "run.completed"
    assert_quiet(gateway.log())


async def refused_once_full(gateway: GatewayProcess, attempts: int = 20) -> list[str | None]:
    """Run starts until one is refused. SQLite reuses the space its write-ahead log already
    holds, so the first few may fit on a full disk; each one accepted streams its run in the
    background, which soon needs space that is not there."""
    outcomes = [await refused_run(gateway)]
    while outcomes[-1] is None and len(outcomes) < attempts:
        await asyncio.sleep(0.3)
        outcomes.append(await refused_run(gateway))
    return outcomes


# The disk fills up right after a run, or once its write-ahead log has been checkpointed (the
# store does so in the background at most every second): then the next writes reuse the log's
# space and fit for a while.
@pytest.mark.parametrize("settle_s", [0.0, 2.5], ids=["at-once", "after-a-checkpoint"])
async def test_a_full_disk(
    spawn: Callable[..., GatewayProcess], tmp_path: Path, settle_s: float
) -> None:
    with small_tmpfs(tmp_path / "disk", "6m") as disk:
        gateway = spawn(env=env_for(disk / "gateway.db"))
        assert (await run_once(gateway))["event"] == "run.completed"
        await asyncio.sleep(settle_s)
        filler = fill(disk)
        try:
            outcomes = await refused_once_full(gateway)
            assert outcomes[-1] == "unavailable", outcomes
            status, body = await readiness(gateway)
            assert status == 503, (outcomes, body)
            assert "full" in body["reason"], body
            # While the disk stays full, no start gets through, however small its write.
            assert [await refused_run(gateway) for _ in range(3)] == ["unavailable"] * 3
        finally:
            filler.unlink()
        assert await ready_again(gateway), gateway.log()[-3000:]
        assert (await run_once(gateway))["event"] == "run.completed"
        gateway.terminate()
        assert_quiet(gateway.log())


def blob_of(size: int) -> Work[None]:
    """A write that needs `size` bytes of new pages."""

    def write(conn: Connection) -> None:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS ballast (b BLOB)")
        conn.exec_driver_sql(f"INSERT INTO ballast VALUES (zeroblob({size}))")

    return write


async def test_no_write_is_tried_while_the_disk_is_full(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        async with migrated_store(database_url(disk / "gateway.db")) as store:
            health = StorageHealth(store, probe_every_s=PROBE_S)
            reporting = ReportingStore(store, health)
            try:
                filler = fill(disk)
                try:
                    with pytest.raises(StorageUnavailable):
                        await reporting.write(blob_of(1024 * 1024))
                    assert health.disk_full and "full" in (health.reason or ""), health.reason
                    tried: list[Connection] = []
                    with pytest.raises(StorageUnavailable, match="full"):
                        await reporting.write(tried.append)
                    assert tried == []
                finally:
                    filler.unlink()
                assert await eventually(lambda: health.reason is None, BACK_WITHIN_S)
                assert not health.disk_full
                await reporting.write(tried.append)
                assert len(tried) == 1
            finally:
                await health.close()


# The background checkpoints' timing on a 6 MB tmpfs is the test's subject: beside other tests'
# load (xdist workers on a 2-core machine) a checkpoint can take the room left for a commit.
@pytest.mark.skipif(
    "PYTEST_XDIST_WORKER" in os.environ,
    reason="timing-bound: run alone, `python3 dev.py test tests/hostile/test_storage_health.py`",
)
async def test_failing_checkpoints_are_one_line_each_way(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A WAL checkpoint that cannot grow the database file: one WARNING with the cause when
    they start failing (no traceback, not one a second), one INFO when they go through."""
    caplog.set_level(logging.INFO, logger=sqlite_store.__name__)
    with small_tmpfs(tmp_path / "disk", "6m") as disk:
        async with migrated_store(database_url(disk / "gateway.db")) as store:

            def records() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "WAL checkpoint" in r.getMessage()]

            async def write_and_settle() -> None:
                # A checkpoint is due at most every CHECKPOINT_EVERY_S, after a commit.
                await asyncio.sleep(sqlite_store.CHECKPOINT_EVERY_S + 0.1)
                await store.write(probe_in)
                await asyncio.sleep(0.5)

            # Pages in the WAL that the database file must grow to take.
            await store.write(blob_of(2 * 1024 * 1024))
            filler = fill(disk)
            try:
                for _ in range(3):
                    # Room for a commit's few WAL pages, not for the checkpoint, which takes
                    # what it finds before it fails.
                    os.truncate(filler, filler.stat().st_size - 256 * 1024)
                    await write_and_settle()
            finally:
                filler.unlink()
            await write_and_settle()
    failed, back = records()
    assert failed.levelno == logging.WARNING and failed.exc_info is None, failed
    assert "database or disk is full" in failed.getMessage(), failed.getMessage()
    assert back.levelno == logging.INFO, back


def damage_a_page(db: Path) -> None:
    """Garbage over one page in the middle of the file (not the header page)."""
    with sqlite3.connect(db) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pages = db.stat().st_size // page_size
    assert pages > 4, pages
    with db.open("r+b") as out:
        out.seek((pages // 2) * page_size)
        out.write(os.urandom(page_size))


async def test_a_damaged_page(spawn: Callable[..., GatewayProcess], tmp_path: Path) -> None:
    db = tmp_path / "gateway.db"
    async with running_gateway(settings_for(db)) as first:
        client = await Client.connect(first.ws_url, first.token("alice"))
        for index in range(8):
            await client.request("run.start", input=f"thread number {index} " * 30)
            await client.wait_event("run.completed")
            client.frames.clear()
        await client.close()
    damage_a_page(db)
    with pytest.raises(RuntimeError, match="exited early") as refused:
        spawn(env=env_for(db))
    assert "fails SQLite's integrity check" in str(refused.value)
    assert "GATEWAY_ALLOW_DAMAGED_DATABASE" in str(refused.value)
    # Allowed to start anyway: up, and not ready.
    gateway = spawn(env=env_for(db, GATEWAY_ALLOW_DAMAGED_DATABASE="true"))
    status, body = await readiness(gateway)
    assert status == 503 and "damaged" in body["reason"], body
    gateway.terminate()
    assert_quiet(gateway.log(), recoveries=0)


async def test_a_database_that_goes_away_and_comes_back(
    spawn: Callable[..., GatewayProcess],
) -> None:
    import asyncpg
    from sqlalchemy.engine import make_url

    from tests.support.postgres import SERVER_URL, postgres_database

    admin = make_url(SERVER_URL).set(drivername="postgresql").render_as_string(hide_password=False)
    async with postgres_database() as url:
        name = make_url(url).database
        gateway = spawn(env={"GATEWAY_DATABASE_URL": url, "GATEWAY_STORAGE_PROBE_S": str(PROBE_S)})
        assert (await readiness(gateway))[0] == 200
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                name,
            )
            assert await refused_run(gateway) == "unavailable"
            status, body = await readiness(gateway)
            assert status == 503, body
            await conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        finally:
            await conn.close()
        assert await ready_again(gateway), gateway.log()[-3000:]
        assert (await run_once(gateway))["event"] == "run.completed"
        gateway.terminate()
        assert_quiet(gateway.log())
