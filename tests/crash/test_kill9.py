"""kill -9 the gateway and restart it on the same SQLite file (docs/architecture.md "Shutdown and
crash recovery").

Every test runs a real `python -m gateway serve` subprocess, SIGKILLs it (no shutdown code runs)
and starts a fresh one on the same database, then checks what a new subscriber sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.client import Client
from tests.support.crash import (
    AGENTS_ARGS,
    TIMEOUT,
    assert_dense,
    charges,
    close_all,
    comparable,
    connect,
    crash,
    describe,
    http,
    subscribe_from_start,
    wait_run_end,
)
from tests.support.gateway import GatewayProcess, spawn_gateway

pytestmark = pytest.mark.both_backends


@pytest.fixture
def spawn(tmp_path: Path, database_url: str) -> Iterator[Callable[..., GatewayProcess]]:
    """Spawn gateways on the test's database; every one is SIGKILLed at teardown."""
    spawned: list[GatewayProcess] = []

    def start(env: dict[str, str] | None = None, args: list[str] | None = None) -> GatewayProcess:
        gw = spawn_gateway(
            tmp_path, env={"GATEWAY_DATABASE_URL": database_url, **(env or {})}, args=args
        )
        spawned.append(gw)
        return gw

    yield start
    for gw in spawned:
        gw.kill()


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    opened: list[Client] = []
    yield opened
    # Each test closes them with `close_all` (teardown here is sync); sockets to a killed
    # gateway are dead anyway.


# -- 1. kill -9 while paused --------------------------------------------------------------------


async def test_kill9_while_paused_keeps_log_and_approval(tmp_path: Path, spawn, clients) -> None:
    effects = tmp_path / "effects.jsonl"
    env = {"TEST_EFFECTS_FILE": str(effects)}
    first = spawn(env=env, args=AGENTS_ARGS)
    try:
        alice = await connect(first, clients, "alice", "user")
        ack = await alice.request("run.start", input="charge me", agent="effects")
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        paused = await alice.wait_event("run.paused", TIMEOUT)
        assert paused["data"]["reason"] == "approval"
        before = alice.events_of(thread_id)
        assert_dense(before)
        requested = [e for e in before if e["event"] == "approval.requested"]
        assert len(requested) == 1
        approval_id = requested[0]["data"]["approval_id"]
        assert charges(effects) == 0

        await crash(first, clients)
        second = spawn(env=env, args=AGENTS_ARGS)

        watcher = await subscribe_from_start(second, clients, thread_id)
        await watcher.wait_for(
            lambda f: f.get("type") == "event" and f["seq"] == before[-1]["seq"], TIMEOUT
        )
        replayed = watcher.events_of(thread_id)
        assert [comparable(e) for e in replayed[: len(before)]] == [comparable(e) for e in before]
        assert replayed[: len(before)] == before  # the very same frames

        async with http(second, "bob", "reviewer") as bob_http:
            listed = (await bob_http.get("/v1/approvals")).json()["approvals"]
            assert [a["approval_id"] for a in listed] == [approval_id]
            run = (await bob_http.get(f"/v1/runs/{run_id}")).json()["run"]
            assert run["status"] == "waiting_for_review"

        bob = await connect(second, clients, "bob", "reviewer")
        decided = await bob.request("approval.decide", approval_id=approval_id, decision="approve")
        assert decided["approval"]["status"] == "approved"

        end = await wait_run_end(watcher, run_id)
        assert end["event"] == "run.completed", describe(second)
        events = watcher.events_of(thread_id)
        assert_dense(events)
        names = [e["event"] for e in events[len(before) :]]
        assert names[:2] == ["approval.decided", "run.resumed"]
        assert "tool.output" in names
        assert charges(effects) == 1
        async with http(second, "bob", "reviewer") as bob_http:
            assert (await bob_http.get("/v1/approvals")).json()["approvals"] == []
    finally:
        await close_all(clients)


# -- 2. kill -9 mid-stream ----------------------------------------------------------------------


async def test_kill9_mid_stream_aborts_message_and_restarts_from_input(spawn, clients) -> None:
    env = {"GATEWAY_DEMO_DELAY_MS": "20"}
    first = spawn(env=env)
    try:
        alice = await connect(first, clients, "alice", "user")
        ack = await alice.request("run.start", input="tell me a story")
        thread_id, run_id = ack["thread_id"], ack["run_id"]

        deltas = 0

        def tenth_delta(frame: dict[str, Any]) -> bool:
            nonlocal deltas  # wait_for scans each frame once, in order
            deltas += frame.get("event") == "message.delta"
            return deltas >= 10

        await alice.wait_for(tenth_delta, TIMEOUT)
        first.kill()
        before = alice.events_of(thread_id)
        await close_all(clients)
        assert_dense(before)
        assert not [e for e in before if e["event"] in ("message.completed", "run.completed")], (
            "the story finished before the kill; raise GATEWAY_DEMO_DELAY_MS"
        )
        started = [e for e in before if e["event"] == "message.started"]
        assert len(started) == 1
        message_id = started[0]["data"]["message_id"]

        second = spawn(env=env)
        watcher = await subscribe_from_start(second, clients, thread_id)
        end = await wait_run_end(watcher, run_id)
        assert end["event"] == "run.completed", describe(second)
        events = watcher.events_of(thread_id)
        assert_dense(events)
        assert len({e["seq"] for e in events}) == len(events)
        assert [comparable(e) for e in events[: len(before)]] == [comparable(e) for e in before]

        # Events stored before the kill but not yet delivered may follow: only deltas of the
        # open message.
        rest = events[len(before) :]
        names = [e["event"] for e in rest]
        aborted_at = names.index("message.aborted")
        assert set(names[:aborted_at]) <= {"message.delta"}, names
        aborted = rest[aborted_at]
        assert aborted["data"]["message_id"] == message_id
        assert aborted["data"].get("reason")
        recovered = rest[aborted_at + 1]
        assert recovered["event"] == "run.recovered", names
        assert recovered["data"] == {"checkpoint_version": None}
        assert recovered["run_id"] == run_id

        after = rest[aborted_at + 2 :]
        after_names = [e["event"] for e in after]
        assert after_names[0] == "message.started", after_names
        new_id = after[0]["data"]["message_id"]
        assert new_id != message_id
        completed = [e for e in after if e["event"] == "message.completed"]
        assert [e["data"]["message_id"] for e in completed] == [new_id]
        assert len(completed[0]["data"]["text"].split()) >= 200
        assert after_names[-1] == "run.completed"
        assert after_names.count("run.completed") == 1
        assert "message.aborted" not in after_names
        assert {e["run_id"] for e in events} == {run_id}

        async with http(second, "alice", "user") as alice_http:
            run = (await alice_http.get(f"/v1/runs/{run_id}")).json()["run"]
            assert run["status"] == "completed"
    finally:
        await close_all(clients)


# -- 3. kill -9 after a decision, while the continuation streams --------------------------------


@pytest.mark.parametrize("kill_after", ["run.resumed", "tool.output"])
async def test_kill9_after_decision_completes_run(
    tmp_path: Path, spawn, clients, kill_after: str
) -> None:
    effects = tmp_path / "effects.jsonl"
    env = {"TEST_EFFECTS_FILE": str(effects)}
    first = spawn(env=env, args=AGENTS_ARGS)
    try:
        alice = await connect(first, clients, "alice", "user")
        bob = await connect(first, clients, "bob", "reviewer")
        ack = await alice.request("run.start", input="charge me", agent="effects")
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        requested = await alice.wait_event("approval.requested", TIMEOUT)
        await alice.wait_event("run.paused", TIMEOUT)
        await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event(kill_after, TIMEOUT)
        first.kill()
        before = alice.events_of(thread_id)
        await close_all(clients)
        assert_dense(before)
        seen_before = [e["event"] for e in before]
        charges_before_restart = charges(effects)

        second = spawn(env=env, args=AGENTS_ARGS)
        watcher = await subscribe_from_start(second, clients, thread_id)
        end = await wait_run_end(watcher, run_id)
        assert end["event"] == "run.completed", describe(second)
        events = watcher.events_of(thread_id)
        assert_dense(events)
        assert [comparable(e) for e in events[: len(before)]] == [comparable(e) for e in before]
        names = [e["event"] for e in events]
        count = charges(effects)
        print(
            f"\n[crash test 3, kill after {kill_after}] charge executions: {count} "
            f"(before restart: {charges_before_restart}); "
            f"seen before kill: {seen_before}; full log: {names}"
        )
        # Exactly once: the operation ledger returns the stored result to the replayed call.
        assert count == 1, count
        outputs = [e for e in events if e["event"] == "tool.output"]
        assert len(outputs) == len({e["data"]["call_id"] for e in outputs}) == 1, outputs
        async with http(second, "alice", "user") as alice_http:
            run = (await alice_http.get(f"/v1/runs/{run_id}")).json()["run"]
            assert run["status"] == "completed"
    finally:
        await close_all(clients)


# -- 4. restart with nothing to recover ---------------------------------------------------------


async def test_restart_with_nothing_to_recover_is_ready(spawn, clients) -> None:
    first = spawn()
    try:
        alice = await connect(first, clients, "alice", "user")
        ack = await alice.request("run.start", input="hello there")
        await wait_run_end(alice, ack["run_id"])
        before = alice.events_of(ack["thread_id"])
        await crash(first, clients)

        second = spawn()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{second.port}") as plain:
            ready = await plain.get("/readyz", timeout=30)
            assert ready.status_code == 200, ready.text
            assert ready.json()["status"] == "ready"
            assert (await plain.get("/healthz", timeout=30)).status_code == 200
        log = second.log()
        assert "recovered" not in log.lower(), log
        assert "Traceback" not in log, log

        watcher = await subscribe_from_start(second, clients, ack["thread_id"])
        await watcher.wait_for(
            lambda f: f.get("type") == "event" and f["seq"] == before[-1]["seq"], TIMEOUT
        )
        await asyncio.sleep(0.5)  # nothing is appended by a restart with nothing to recover
        assert watcher.events_of(ack["thread_id"]) == before
        # The fresh process serves new runs.
        bob = await connect(second, clients, "bob", "user")
        again = await bob.request("run.start", input="hi again")
        assert (await wait_run_end(bob, again["run_id"]))["event"] == "run.completed"
    finally:
        await close_all(clients)
