"""Run leases: two gateway processes on one database never execute one run at the same time,
a dead process's runs are taken over when its lease expires, and a stale lease cannot write."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from gateway.auth.access import TokenVerifier
from persistence.backends import open_store
from persistence.leases import LeaseLost, LeaseRepository
from persistence.run_status import RunStatus
from persistence.runs import RunRepository
from persistence.tables import runs
from persistence.threads import ThreadRepository
from tests.integration.test_operator_cli import cli, paused_with_a_reviewer
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, spawn_gateway
from tests.support.storage import (
    expire_lease,
    insert_running_run,
    migrated_store,
    running_event_log,
)

pytestmark = pytest.mark.both_backends

TOKEN = TokenVerifier(TEST_SECRET)


async def events_of(process, thread_id: str) -> list[dict]:
    token = TOKEN.issue("alice", "acme", ["user"])
    async with httpx.AsyncClient() as http:
        response = await http.get(
            f"http://127.0.0.1:{process.port}/v1/threads/{thread_id}/events?limit=1000",
            headers={"Authorization": f"Bearer {token}"},
        )
    return response.json()["events"]


async def test_second_process_leaves_a_live_run_alone_then_takes_it_over_when_its_owner_dies(
    tmp_path: Path, database_url: str, processes
) -> None:
    env = {
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_LEASE_TTL_S": "2",
        "GATEWAY_DEMO_DELAY_MS": "80",
    }
    a = spawn_gateway(tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-a"})
    processes.append(a)
    alice = await Client.connect(a.ws_url, TOKEN.issue("alice", "acme", ["user"]))
    ack = await alice.request("run.start", input="tell me a story about two gateways")
    await alice.wait_event("message.delta")

    b = spawn_gateway(
        tmp_path,
        env={
            **env,
            "GATEWAY_INSTANCE_ID": "gw-b",
            "GATEWAY_DEMO_DELAY_MS": "2",
        },
    )
    processes.append(b)
    await asyncio.sleep(3)  # more than a lease TTL: A renews, so B must not take over
    names = [e["event"] for e in await events_of(b, ack["thread_id"])]
    assert "run.recovered" not in names
    assert names.count("message.started") == 1
    assert "run.completed" not in names, "the story must still be streaming when A dies"

    a.kill()
    watcher = await Client.connect(b.ws_url, TOKEN.issue("alice", "acme", ["user"]))
    await watcher.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
    await watcher.wait_event("run.completed", timeout=60)
    events = watcher.events_of(ack["thread_id"])
    names = [e["event"] for e in events]
    assert names.count("run.recovered") == 1
    assert names.count("run.completed") == 1
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    await alice.close()
    await watcher.close()


async def test_a_reasoning_summary_cut_by_its_process_dying_is_ended_on_takeover(
    tmp_path: Path, database_url: str, processes
) -> None:
    """As a stop ends a summary being streamed, so does a takeover: `reasoning.completed`,
    `aborted`, with the text streamed before the process died, before `run.recovered`."""
    env = {"GATEWAY_DATABASE_URL": database_url, "GATEWAY_LEASE_TTL_S": "2"}
    a = spawn_gateway(
        tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-a", "GATEWAY_DEMO_DELAY_MS": "400"}
    )
    processes.append(a)
    alice = await Client.connect(a.ws_url, TOKEN.issue("alice", "acme", ["user"]))
    ack = await alice.request("run.start", input="think about lighthouses")
    await alice.wait_event("reasoning.delta")
    a.kill()
    await alice.close()
    b = spawn_gateway(
        tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-b", "GATEWAY_DEMO_DELAY_MS": "2"}
    )
    processes.append(b)
    watcher = await Client.connect(b.ws_url, TOKEN.issue("alice", "acme", ["user"]))
    await watcher.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
    await watcher.wait_event("run.completed", timeout=60)
    events = watcher.events_of(ack["thread_id"])
    await watcher.close()
    names = [e["event"] for e in events]
    cut = events[names.index("reasoning.started")]["data"]["reasoning_id"]
    streamed = "".join(
        e["data"]["delta"]
        for e in events[: names.index("run.recovered")]
        if e["event"] == "reasoning.delta" and e["data"]["reasoning_id"] == cut
    )
    ended = [
        e
        for e in events
        if e["event"] == "reasoning.completed" and e["data"]["reasoning_id"] == cut
    ]
    assert [e["data"] for e in ended] == [{"reasoning_id": cut, "text": streamed, "aborted": True}]
    assert streamed and names.index("reasoning.completed") < names.index("run.recovered")
    assert names.count("run.recovered") == 1 and names[-1] == "run.completed"


async def test_a_process_whose_lease_was_taken_over_stops_streaming_within_a_renewal(
    tmp_path: Path, database_url: str, processes
) -> None:
    env = {
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_LEASE_TTL_S": "1.5",
        "GATEWAY_DEMO_DELAY_MS": "40",
    }
    a = spawn_gateway(tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-a"})
    processes.append(a)
    alice = await Client.connect(a.ws_url, TOKEN.issue("alice", "acme", ["user"]))
    ack = await alice.request("run.start", input="tell me a story about a stolen lease")
    await alice.wait_event("message.delta")
    # Another process takes the run over (as after A stalled past the lease's expiry).
    thief = open_store(database_url)
    try:
        await thief.write(
            lambda conn: conn.execute(
                update(runs)
                .where(runs.c.run_id == ack["run_id"])
                .values(
                    lease_owner="gw-thief",
                    lease_token=runs.c.lease_token + 1,
                    lease_expires_at=datetime(2999, 1, 1, tzinfo=UTC),
                )
            )
        )
    finally:
        await thief.close()
    # A finds out at its next renewal (every 0.5 s) and stops writing for the run.
    for _ in range(100):
        if "lost the lease of run" in a.log():
            break
        await asyncio.sleep(0.05)
    assert f"lost the lease of run {ack['run_id']}" in a.log()
    settled = len(await events_of(a, ack["thread_id"]))
    await asyncio.sleep(1.5)
    events = await events_of(a, ack["thread_id"])
    assert len(events) == settled, "A went on writing for a run it no longer holds"
    names = [e["event"] for e in events]
    assert "run.completed" not in names and "run.failed" not in names
    await alice.close()


async def test_decisions_on_two_processes_start_one_continuation(
    tmp_path: Path, database_url: str, processes
) -> None:
    env = {"GATEWAY_DATABASE_URL": database_url, "GATEWAY_LEASE_TTL_S": "5"}
    a = spawn_gateway(tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-a"})
    b = spawn_gateway(tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-b"})
    processes.extend([a, b])
    alice = await Client.connect(a.ws_url, TOKEN.issue("alice", "acme", ["user"]))
    ack = await alice.request("run.start", input="refund order 8 for 9 and email x@example.com")
    await alice.wait_event("run.paused")
    requested = [e for e in alice.events if e["event"] == "approval.requested"]
    assert len(requested) == 2
    bob_a = await Client.connect(a.ws_url, TOKEN.issue("bob", "acme", ["reviewer"]))
    bob_b = await Client.connect(b.ws_url, TOKEN.issue("carol", "acme", ["reviewer"]))
    await asyncio.gather(
        bob_a.request(
            "approval.decide", approval_id=requested[0]["data"]["approval_id"], decision="approve"
        ),
        bob_b.request(
            "approval.decide", approval_id=requested[1]["data"]["approval_id"], decision="approve"
        ),
    )
    # Watched through the database, not alice's socket on A: which process continues is
    # up to the race, and this test is about there being exactly one continuation.
    token = TOKEN.issue("alice", "acme", ["user"])
    async with httpx.AsyncClient() as http:
        for _ in range(600):
            run = (
                await http.get(
                    f"http://127.0.0.1:{a.port}/v1/runs/{ack['run_id']}",
                    headers={"Authorization": f"Bearer {token}"},
                )
            ).json()["run"]
            if run["status"] == "completed":
                break
            await asyncio.sleep(0.1)
    assert run["status"] == "completed", run
    await asyncio.sleep(1)  # a second continuation, if any, would show up by now
    names = [e["event"] for e in await events_of(a, ack["thread_id"])]
    assert names.count("run.resumed") == 1
    assert names.count("tool.output") == 2
    assert names.count("run.completed") == 1
    for client in (alice, bob_a, bob_b):
        await client.close()


async def test_a_stale_lease_cannot_append_or_checkpoint(database_url: str) -> None:
    async with (
        migrated_store(database_url) as store,
        running_event_log(store) as log,
    ):
        thread = await ThreadRepository(store).create(tenant="acme", owner="alice")
        await insert_running_run(store, "r_fence", thread.thread_id)
        leases = LeaseRepository(store)
        old = await leases.acquire("r_fence", "gw-a", ttl_s=30)
        assert old is not None
        assert await leases.acquire("r_fence", "gw-b", ttl_s=30) is None  # still held
        # gw-a stops renewing; its lease expires and gw-b takes over.
        await expire_lease(store, "r_fence")
        new = await leases.acquire("r_fence", "gw-b", ttl_s=30)
        assert new is not None and new.token > old.token
        assert not await leases.renew(old, 30)

        stale = await log.append(thread.thread_id, "r_fence", "message.delta", {"d": 1}, old)
        fresh = await log.append(thread.thread_id, "r_fence", "message.delta", {"d": 2}, new)
        with pytest.raises(LeaseLost):
            await stale
        stored = await fresh
        assert stored.seq == 1  # only the current holder's event got a seq
        with pytest.raises(LeaseLost):
            await log.commit([log.new_event(thread.thread_id, "r_fence", "x", {}, old)])
        assert [e.seq for e in await log.read(thread.thread_id, after_seq=0)] == [1]


async def test_a_lease_scan_that_read_a_run_before_it_paused_leaves_no_lease_on_it(
    database_url: str, gateway_factory: Any
) -> None:
    """A scan lists the running runs, then takes each one's lease: a run that paused in between
    (its lease released) is no longer the scan's to recover, and the lease it took is given back
    at once. Kept, it would refuse an operator's cancel and a decision's continuation on
    another process (whose lease it is not) until it expired."""
    async with paused_with_a_reviewer(gateway_factory) as (gw, _alice, _bob, paused):
        assert gw.app is not None
        services = gw.app.state.services
        run = await RunRepository(services.store).get(paused["run_id"])
        assert run is not None and run.status is RunStatus.WAITING_FOR_REVIEW
        as_the_scan_read_it = replace(run, status=RunStatus.RUNNING)

        assert await services.runs.recovery.recover_run(as_the_scan_read_it) is False

        holder = await services.store.write(
            partial(LeaseRepository.live_holder_in, run_id=run.run_id)
        )
        assert holder is None
        done = await cli(database_url, "runs", "cancel", run.run_id)
        assert done.status == 0, done.err
        after = await RunRepository(services.store).get(run.run_id)
        assert after is not None and after.status is RunStatus.CANCELLED
