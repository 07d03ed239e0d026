"""Retention: ended runs' checkpoints and log prefix are removed, decisions are kept, the
thread's epoch changes so old cursors reset, and seq never restarts."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.client import Client
from tests.support.storage import rows

pytestmark = pytest.mark.both_backends


async def events_body(gw, thread_id: str) -> dict:
    async with gw.http() as http:
        response = await http.get(
            f"/v1/threads/{thread_id}/events?limit=1000",
            headers={"Authorization": f"Bearer {gw.token('alice')}"},
        )
    assert response.status_code == 200
    return response.json()


async def test_retention_truncates_ended_runs_and_resets_old_cursors(
    gateway_factory, database_url
) -> None:
    # Long enough that the log is read whole after the run ends even on a loaded machine,
    # before the sweep truncates it.
    async with gateway_factory(retention_s=3.0, retention_sweep_s=0.2) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        bob = await Client.connect(gw.ws_url, gw.token("bob", "reviewer"))
        ack = await alice.request("run.start", input="refund order 3 for 4")
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        requested = await alice.wait_event("approval.requested")
        await bob.request(
            "approval.decide",
            approval_id=requested["data"]["approval_id"],
            decision="reject",
            reason="not this one",
        )
        await alice.wait_event("run.completed")
        before = await events_body(gw, thread_id)
        head, epoch = before["head_seq"], before["epoch"]
        assert before["truncated_seq"] == 0 and len(before["events"]) == head

        for _ in range(200):  # the sweep runs every 0.2 s once the run is 3 s old
            after = await events_body(gw, thread_id)
            if after["truncated_seq"]:
                break
            await asyncio.sleep(0.1)
        assert after["truncated_seq"] == head
        assert after["events"] == [] and after["head_seq"] == head
        assert after["epoch"] != epoch

        assert await rows(
            database_url, "select count(*) from checkpoints where run_id = ?", run_id
        ) == [(0,)]
        decision = await rows(
            database_url, "select status, reviewer, reason from approvals where run_id = ?", run_id
        )
        assert decision == [("rejected", "bob", "not this one")]  # decisions are kept

        # An old cursor (and the old epoch) cannot be honoured: reset, then live events.
        late = await Client.connect(gw.ws_url, gw.token("alice"))
        await late.request("thread.subscribe", thread_id=thread_id, after_seq=3, epoch=epoch)
        subscribed = await late.wait_for(lambda f: f.get("type") == "subscribed")
        assert subscribed["reset"] is True and subscribed["epoch"] == after["epoch"]

        # The log goes on from where it was: seq is never reused.
        ack2 = await alice.request("run.input", thread_id=thread_id, input="hello again")
        assert ack2["disposition"] == "started"
        started = await late.wait_event("run.started")
        assert started["seq"] == head + 1
        await late.wait_event("run.completed")
        assert late.events_of(thread_id)[0]["seq"] == head + 1
        for client in (alice, bob, late):
            await client.close()


async def test_retention_off_keeps_everything(gateway_factory) -> None:
    async with gateway_factory(retention_sweep_s=0.1) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        ack = await alice.request("run.start", input="hello")
        await alice.wait_event("run.completed")
        await asyncio.sleep(0.5)
        body = await events_body(gw, ack["thread_id"])
        assert body["truncated_seq"] == 0
        assert len(body["events"]) == body["head_seq"] > 0
        await alice.close()
