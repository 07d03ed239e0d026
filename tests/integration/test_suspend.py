"""on_disconnect "suspend" (docs/protocol.md §6) and graceful shutdown: checkpoint at a turn
boundary, continue later with nothing repeated."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx

from gateway.auth.access import TokenVerifier
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, Gateway, spawn_gateway

STATUS_INPUT = "status of orders 11, 12, 13, 14 and 15"


async def run_status(gw: Gateway, run_id: str) -> dict:
    async with gw.http() as http:
        response = await http.get(
            f"/v1/runs/{run_id}", headers={"Authorization": f"Bearer {gw.token('alice')}"}
        )
    assert response.status_code == 200
    return response.json()["run"]


async def wait_status(gw: Gateway, run_id: str, status: str, timeout: float = 20) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        run = await run_status(gw, run_id)
        if run["status"] == status:
            return run
        assert asyncio.get_running_loop().time() < deadline, f"run stayed {run['status']}"
        await asyncio.sleep(0.05)


def tool_calls(events: list[dict]) -> list[int]:
    return [e["data"]["arguments"]["order_id"] for e in events if e["event"] == "tool.called"]


async def test_unwatched_suspend_run_is_checkpointed_and_continues_on_subscribe(
    gateway_factory,
) -> None:
    async with gateway_factory(suspend_grace_s=0.2, demo_delay_ms=15) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        ack = await alice.request("run.start", input=STATUS_INPUT, on_disconnect="suspend")
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        await alice.wait_event("tool.output")
        await alice.close()

        suspended = await wait_status(gw, run_id, "suspended")
        assert suspended["checkpoint_version"] >= 1
        assert suspended["pending_approvals"] == []

        watcher = await Client.connect(gw.ws_url, gw.token("alice"))
        await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        await watcher.wait_event("run.completed", timeout=30)
        events = watcher.events_of(thread_id)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        paused = [e for e in events if e["event"] == "run.paused"]
        assert paused and paused[0]["data"]["reason"] == "disconnect"
        resumed = [e for e in events if e["event"] == "run.resumed"]
        assert resumed[0]["data"]["checkpoint_version"] == paused[0]["data"]["checkpoint_version"]
        # Nothing repeated: each order looked up exactly once, in order.
        assert tool_calls(events) == [11, 12, 13, 14, 15]
        final = events[-1]["data"]["final_output"]
        assert all(f"Order {n}" in final for n in (11, 12, 13, 14, 15))
        assert {e["run_id"] for e in events} == {run_id}
        await watcher.close()


async def test_run_resume_continues_a_suspended_run(gateway_factory) -> None:
    async with gateway_factory(suspend_grace_s=0.2, demo_delay_ms=15) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        ack = await alice.request("run.start", input=STATUS_INPUT, on_disconnect="suspend")
        await alice.wait_event("tool.output")
        await alice.close()
        await wait_status(gw, ack["run_id"], "suspended")

        controller = await Client.connect(gw.ws_url, gw.token("alice"))
        resumed = await controller.request("run.resume", run_id=ack["run_id"])
        assert resumed["run_id"] == ack["run_id"]
        # Nobody watches, so it may suspend again at the next boundary; it never repeats work.
        await controller.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
        await controller.wait_event("run.completed", timeout=30)
        assert tool_calls(controller.events_of(ack["thread_id"])) == [11, 12, 13, 14, 15]
        await controller.close()


async def test_continue_runs_on_without_watchers(gateway_factory) -> None:
    async with gateway_factory(suspend_grace_s=0.1, demo_delay_ms=5) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        ack = await alice.request("run.start", input=STATUS_INPUT)
        await alice.wait_event("message.delta")
        await alice.close()
        await wait_status(gw, ack["run_id"], "completed", timeout=30)
        async with gw.http() as http:
            body = (
                await http.get(
                    f"/v1/threads/{ack['thread_id']}/events?limit=1000",
                    headers={"Authorization": f"Bearer {gw.token('alice')}"},
                )
            ).json()
        names = [e["event"] for e in body["events"]]
        assert "run.paused" not in names and "run.resumed" not in names
        assert tool_calls(body["events"]) == [11, 12, 13, 14, 15]


async def test_resume_of_a_running_run_is_conflict(gateway) -> None:
    alice = await Client.connect(gateway.ws_url, gateway.token("alice"))
    ack = await alice.request("run.start", input="refund order 4")
    await alice.wait_event("run.paused")
    failure = None
    try:
        await alice.request("run.resume", run_id=ack["run_id"])
    except AssertionError as exc:
        failure = exc
    assert failure is not None and getattr(failure, "code", None) == "conflict"
    await alice.close()


async def test_sigterm_checkpoints_streaming_runs_and_next_start_continues(tmp_path: Path) -> None:
    verifier = TokenVerifier(TEST_SECRET)
    token = verifier.issue("alice", "acme", ["user"])
    env = {"GATEWAY_DEMO_DELAY_MS": "40"}
    first = spawn_gateway(tmp_path, env=env)
    try:
        client = await Client.connect(f"ws://127.0.0.1:{first.port}/v1/ws", token)
        ack = await client.request("run.start", input=STATUS_INPUT)
        await client.wait_event("tool.output", timeout=30)
        first.process.send_signal(signal.SIGTERM)
        code, _ = await asyncio.wait_for(client.closed, 30)
        assert code == 1012
        await asyncio.to_thread(first.process.wait, 30)
        # uvicorn re-raises the signal after a complete graceful shutdown.
        assert first.process.returncode in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in first.log()
    finally:
        first.kill()

    second = spawn_gateway(tmp_path, env={"GATEWAY_DEMO_DELAY_MS": "0"})
    try:
        watcher = await Client.connect(f"ws://127.0.0.1:{second.port}/v1/ws", token)
        await watcher.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
        await watcher.wait_event("run.completed", timeout=30)
        events = watcher.events_of(ack["thread_id"])
        names = [e["event"] for e in events]
        paused = next(e for e in events if e["event"] == "run.paused")
        assert paused["data"]["reason"] == "shutdown"
        assert names.index("run.paused") < names.index("run.resumed")
        assert "run.recovered" not in names  # a clean stop needs no recovery
        assert tool_calls(events) == [11, 12, 13, 14, 15]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        async with httpx.AsyncClient() as http:
            run = (
                await http.get(
                    f"http://127.0.0.1:{second.port}/v1/runs/{ack['run_id']}",
                    headers={"Authorization": f"Bearer {token}"},
                )
            ).json()["run"]
        assert run["status"] == "completed"
        await watcher.close()
    finally:
        second.kill()
