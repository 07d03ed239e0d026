"""The SSE feed and HTTP runs across gateway processes on one database: a run started over HTTP
on one process is followed on another's feed, dropped there and resumed on the first."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.integration.test_cross_process import TOKEN, bus_env, pair
from tests.integration.test_sse import is_event, read_until
from tests.support.gateway import GatewayProcess

pytestmark = pytest.mark.both_backends


def auth(user: str, *roles: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN.issue(user, 'acme', list(roles))}"}


@pytest.mark.parametrize("bus", ["memory", "redis"])
async def test_a_feed_on_another_process_resumes_on_the_first_without_gap_or_repeat(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess], bus: str
) -> None:
    a, b = pair(tmp_path, database_url, processes, **bus_env(bus))
    alice = auth("alice", "user")
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.port}", timeout=10) as on_a,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.port}", timeout=10) as on_b,
    ):
        started = await on_a.post(
            "/v1/runs", json={"input": "refund order 42 for 30"}, headers=alice
        )
        assert started.status_code == 200, started.text
        thread_id = started.json()["thread_id"]
        path = f"/v1/threads/{thread_id}/stream"
        _, first = await asyncio.wait_for(read_until(on_b, path, alice, is_event("run.paused")), 20)
        requested = next(e for e in first if e["event"] == "approval.requested")
        decided = await on_b.post(
            f"/v1/approvals/{requested['data']['approval_id']}/decision",
            json={"decision": "approve"},
            headers=auth("bob", "reviewer"),
        )
        assert decided.status_code == 200, decided.text
        resumed = alice | {"Last-Event-ID": str(first[-1]["seq"])}
        _, rest = await asyncio.wait_for(
            read_until(on_a, path, resumed, is_event("run.completed")), 20
        )
        log = (await on_a.get(f"/v1/threads/{thread_id}/events", headers=alice)).json()
    received = first + rest
    assert [e["seq"] for e in received] == list(range(1, len(received) + 1))
    assert received == log["events"]
