"""What a gateway says as it starts and stops: every line in the configured format (JSON too,
the supervisor of `serve --workers` included), none of Alembic's chatter, one line naming the
instance id, the database and the bus, without credentials; and at shutdown, the runs it hands
over."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app import redacted_url
from tests.support.client import Client
from tests.support.gateway import GatewayProcess, spawn_gateway


def test_every_start_up_line_of_a_supervisor_and_its_workers_is_json(
    tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    gateway = spawn_gateway(
        tmp_path,
        env={"GATEWAY_LOG_FORMAT": "json", "GATEWAY_INSTANCE_ID": "gw-json"},
        args=["--workers", "2"],
        # Three interpreters starting at once on a loaded machine.
        start_within_s=90,
    )
    processes.append(gateway)
    gateway.terminate()
    lines = [line for line in gateway.log().splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a line that is not JSON: {line!r}") from None
    assert not [r for r in records if r["logger"].startswith("alembic")], "alembic's INFO lines"
    messages = [r["message"] for r in records]
    assert any(m.startswith("schema created at revision") for m in messages), messages
    ready = [m for m in messages if m.startswith("gateway ready")]
    assert len(ready) == 2, messages  # one per worker
    assert all("instance gw-json/" in m and "database sqlite:///" in m for m in ready)
    assert all("bus memory://" in m for m in ready)


def test_a_single_process_says_nothing_of_alembic_s(
    tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    gateway = spawn_gateway(tmp_path)
    processes.append(gateway)
    gateway.terminate()
    assert "alembic" not in gateway.log()
    assert "gateway ready: instance test-gateway, database sqlite:///" in gateway.log()


def test_credentials_are_left_out_of_the_urls_logged() -> None:
    assert redacted_url("postgresql+asyncpg://gw:s3cret@db:5432/gw") == (
        "postgresql+asyncpg://gw:***@db:5432/gw"
    )
    assert redacted_url("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert "s3cret" not in redacted_url("rediss://user:s3cret@cache/0")
    assert redacted_url("memory://") == "memory://"
    # Both redis-py and asyncpg also take the password as a query parameter.
    assert redacted_url("redis://cache:6379/0?password=s3cret&db=1") == (
        "redis://cache:6379/0?db=1&password=***"
    )
    assert redacted_url("postgresql+asyncpg://gw@db/gw?password=s3cret&ssl=require") == (
        "postgresql+asyncpg://gw@db/gw?password=***&ssl=require"
    )
    assert "s3cret" not in redacted_url("unix:///run/redis.sock?db=0&password=s3cret")


async def test_shutdown_says_which_runs_it_hands_over(
    gateway_factory: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    async with gateway_factory(demo_delay_ms=50) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        run = await alice.request("run.start", input="tell me a story")
        await alice.wait_event("message.delta")
    said = [r.getMessage() for r in caplog.records if "handing" in r.getMessage()]
    # The story is one model turn, longer than the shutdown's grace: cut, and named.
    assert said == [
        "shutting down: handing 1 run(s) over to the next process to start: 0 at a turn "
        f"boundary, 1 cut mid-turn (those go on from their newest checkpoint): {run['run_id']}"
    ], said
