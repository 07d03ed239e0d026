"""The live thread list across gateway processes on one database and a Redis bus: a list
followed on one process hears of runs, decisions, renames and deletes made on the others
within a second (the log watch, the safety net, all but off)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_cross_process import REFUND, TOKEN, spawn_with_bus
from tests.support.client import Client
from tests.support.gateway import GatewayProcess
from tests.support.redis import bus_prefix, require_redis

pytestmark = pytest.mark.both_backends


def listed(thread_id: str, predicate: Callable[[dict[str, Any]], bool]) -> Any:
    return lambda f: (
        f.get("type") == "threads.update"
        and any(t["thread_id"] == thread_id and predicate(t) for t in f["threads"])
    )


async def test_a_list_on_one_process_follows_changes_made_on_the_others(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    a, b, c = spawn_with_bus(
        tmp_path,
        database_url,
        processes,
        ("gw-a", "gw-b", "gw-c"),
        GATEWAY_BUS_URL=require_redis(),
        GATEWAY_BUS_PREFIX=bus_prefix(),
        GATEWAY_LOG_WATCH_INTERVAL_S="30",
    )
    alice_token = TOKEN.issue("alice", "acme", ["user"])
    alice = await Client.connect(a.ws_url, alice_token)
    lister = await Client.connect(b.ws_url, alice_token)
    bob = await Client.connect(c.ws_url, TOKEN.issue("bob", "acme", ["reviewer"]))
    late: list[float] = []

    async def within_a_second(predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        started = time.monotonic()
        frame = await lister.wait_for(predicate, timeout=5)
        late.append(time.monotonic() - started)
        return frame

    try:
        await lister.request("threads.subscribe")
        await lister.wait_for(lambda f: f.get("type") == "threads")
        ack = await alice.request("run.start", input=REFUND)
        thread_id = ack["thread_id"]
        await within_a_second(listed(thread_id, lambda t: t["pending_approvals"] == 1))
        requested = await alice.wait_event("approval.requested")
        await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        await within_a_second(
            listed(thread_id, lambda t: t["status"] == "completed" and t["pending_approvals"] == 0)
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.port}", timeout=10) as http:
            renamed = await http.patch(
                f"/v1/threads/{thread_id}",
                headers={"Authorization": f"Bearer {alice_token}"},
                json={"title": "Renamed on A"},
            )
            assert renamed.status_code == 200, renamed.text
        await within_a_second(listed(thread_id, lambda t: t["title"] == "Renamed on A"))
        await alice.request("thread.delete", thread_id=thread_id)
        await within_a_second(
            lambda f: f.get("type") == "threads.update" and f["removed"] == [thread_id]
        )
        assert max(late) < 1.0, late
    finally:
        for client in (alice, lister, bob):
            await client.close()
