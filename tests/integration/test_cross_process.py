"""Several gateway processes on one database: what one writes reaches subscribers on another.

A subscriber on B that subscribes right after `run.start` on A must get every event of the run
up to its `run.paused`, within a second, every time: the pause is the run's last event for a
while, so nothing later would wake a subscriber that missed it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.auth.access import TokenVerifier
from tests.support.client import Client, ProtocolFailure
from tests.support.gateway import TEST_SECRET, GatewayProcess, spawn_gateway
from tests.support.redis import RedisServer, bus_prefix, require_redis

pytestmark = pytest.mark.both_backends

TOKEN = TokenVerifier(TEST_SECRET)
REFUND = "refund order 42 for 30 dollars"
TRIES = 20


def pair(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess], **env: str
) -> tuple[GatewayProcess, GatewayProcess]:
    common = {"GATEWAY_DATABASE_URL": database_url, "GATEWAY_DEMO_DELAY_MS": "2", **env}
    a = spawn_gateway(tmp_path, env={**common, "GATEWAY_INSTANCE_ID": "gw-a"})
    b = spawn_gateway(tmp_path, env={**common, "GATEWAY_INSTANCE_ID": "gw-b"})
    processes.extend([a, b])
    return a, b


async def test_a_subscriber_on_another_process_gets_the_pause(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    a, b = pair(tmp_path, database_url, processes)
    token = TOKEN.issue("alice", "acme", ["user"])
    starter = await Client.connect(a.ws_url, token)
    watcher = await Client.connect(b.ws_url, token)
    late: list[float] = []
    try:
        for _ in range(TRIES):
            ack = await starter.request("run.start", input=REFUND)
            thread_id = ack["thread_id"]
            await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
            paused = await starter.wait_for(
                lambda f, t=thread_id: f.get("event") == "run.paused" and f.get("thread_id") == t,
                timeout=10,
            )
            stored_at = time.monotonic()
            await watcher.wait_for(
                lambda f, t=thread_id: f.get("event") == "run.paused" and f.get("thread_id") == t,
                timeout=10,
            )
            late.append(time.monotonic() - stored_at)
            seen = watcher.events_of(thread_id)
            assert [e["seq"] for e in seen] == list(range(1, paused["seq"] + 1))
        assert max(late) < 1.0, late
    finally:
        await starter.close()
        await watcher.close()


def spawn_with_bus(
    tmp_path: Path,
    database_url: str,
    processes: list[GatewayProcess],
    names: tuple[str, ...],
    **env: str,
) -> list[GatewayProcess]:
    common = {"GATEWAY_DATABASE_URL": database_url, "GATEWAY_DEMO_DELAY_MS": "2", **env}
    spawned = [
        spawn_gateway(tmp_path, env={**common, "GATEWAY_INSTANCE_ID": name}) for name in names
    ]
    processes.extend(spawned)
    return spawned


def paused_on(thread_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f.get("event") == "run.paused" and f.get("thread_id") == thread_id


def inbox_change(key: str, approval_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: (
        f.get("type") == "inbox.update"
        and approval_id
        in [item if isinstance(item, str) else item["approval_id"] for item in f.get(key, [])]
    )


async def test_three_processes_hear_each_other_over_redis(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    """A run on A, its watcher and a reviewer's inbox on B, the decision on C: with the log
    watch all but off (30 s), everything reaches B through Redis, within a second."""
    a, b, c = spawn_with_bus(
        tmp_path,
        database_url,
        processes,
        ("gw-a", "gw-b", "gw-c"),
        GATEWAY_BUS_URL=require_redis(),
        GATEWAY_BUS_PREFIX=bus_prefix(),
        GATEWAY_LOG_WATCH_INTERVAL_S="30",
    )
    alice = await Client.connect(a.ws_url, TOKEN.issue("alice", "acme", ["user"]))
    watcher = await Client.connect(b.ws_url, TOKEN.issue("alice", "acme", ["user"]))
    inbox = await Client.connect(b.ws_url, TOKEN.issue("rita", "acme", ["reviewer"]))
    bob = await Client.connect(c.ws_url, TOKEN.issue("bob", "acme", ["reviewer"]))
    try:
        await inbox.request("inbox.subscribe")
        await inbox.wait_for(lambda f: f.get("type") == "inbox")
        ack = await alice.request("run.start", input=REFUND)
        thread_id = ack["thread_id"]
        await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        paused = await alice.wait_for(paused_on(thread_id))
        stored_at = time.monotonic()
        await watcher.wait_for(paused_on(thread_id), timeout=1.0)
        requested = await alice.wait_event("approval.requested")
        approval_id = requested["data"]["approval_id"]
        added = await inbox.wait_for(inbox_change("added", approval_id), timeout=1.0)
        assert time.monotonic() - stored_at < 1.0
        view = next(v for v in added["added"] if v["approval_id"] == approval_id)
        assert view["tool_name"] == "issue_refund" and view["can_decide"] is True

        decided = await bob.request("approval.decide", approval_id=approval_id, decision="approve")
        assert decided["approval"]["status"] == "approved"
        await inbox.wait_for(inbox_change("removed", approval_id), timeout=1.0)
        done = await watcher.wait_for(
            lambda f: f.get("event") == "run.completed" and f.get("thread_id") == thread_id,
            timeout=10,
        )
        events = watcher.events_of(thread_id)
        assert [e["seq"] for e in events] == list(range(1, done["seq"] + 1))
        assert paused["seq"] < done["seq"]
        assert [e["event"] for e in events].count("run.paused") == 1
    finally:
        for client in (alice, watcher, inbox, bob):
            await client.close()


async def test_redis_going_away_slows_delivery_to_the_safety_net_and_loses_nothing(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        a, b = spawn_with_bus(
            tmp_path,
            database_url,
            processes,
            ("gw-a", "gw-b"),
            GATEWAY_BUS_URL=redis.url,
            GATEWAY_BUS_PREFIX=bus_prefix(),
            GATEWAY_LOG_WATCH_INTERVAL_S="5",
            GATEWAY_DEMO_DELAY_MS="10",
        )
        token = TOKEN.issue("alice", "acme", ["user"])
        starter = await Client.connect(a.ws_url, token)
        watcher = await Client.connect(b.ws_url, token)
        try:
            first = await starter.request("run.start", input="tell me a story")
            thread_id = first["thread_id"]
            await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
            await watcher.wait_event("message.delta")
            redis.stop()  # mid-stream
            done = await starter.wait_event("run.completed", timeout=60)
            await watcher.wait_for(
                lambda f: f.get("event") == "run.completed" and f.get("run_id") == first["run_id"],
                timeout=15,
            )
            assert [e["seq"] for e in watcher.events_of(thread_id)] == list(
                range(1, done["seq"] + 1)
            )

            redis.start()
            await wait_for_log(a, "bus back")
            await wait_for_log(b, "bus back")
            # Redis is back: new events come through it again, not at the log watch's pace
            # (5 s; four deliveries each within a second by polling: about 1 in 600).
            for _ in range(4):
                ack = await starter.request("run.input", thread_id=thread_id, input=REFUND)
                assert ack["disposition"] == "started"
                paused = await starter.wait_for(
                    lambda f, r=ack["run_id"]: (
                        f.get("event") == "run.paused" and f.get("run_id") == r
                    )
                )
                stored_at = time.monotonic()
                await watcher.wait_for(
                    lambda f, r=ack["run_id"]: (
                        f.get("event") == "run.paused" and f.get("run_id") == r
                    ),
                    timeout=10,
                )
                assert time.monotonic() - stored_at < 1.0
                await starter.request("run.cancel", run_id=ack["run_id"])
                await watcher.wait_for(
                    lambda f, r=ack["run_id"]: (
                        f.get("event") == "run.cancelled" and f.get("run_id") == r
                    ),
                    timeout=10,
                )
            assert paused["seq"] > done["seq"]
            seen = watcher.events_of(thread_id)
            assert [e["seq"] for e in seen] == list(range(1, seen[-1]["seq"] + 1))
        finally:
            await starter.close()
            await watcher.close()
        assert "bus lost" in a.log() and "bus lost" in b.log()
    finally:
        redis.stop()


async def wait_for_log(process: GatewayProcess, text: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while text not in process.log():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in the log of the gateway on {process.port}")
        await asyncio.sleep(0.1)


STORY = "tell me a story"
STATUS_INPUT = "status of orders 11, 12, 13, 14 and 15"


def bus_env(bus: str) -> dict[str, str]:
    if bus == "memory":
        return {"GATEWAY_BUS_URL": "memory://"}
    return {"GATEWAY_BUS_URL": require_redis(), "GATEWAY_BUS_PREFIX": bus_prefix()}


async def run_status(process: GatewayProcess, run_id: str) -> str:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{process.port}") as http:
        response = await http.get(
            f"/v1/runs/{run_id}",
            headers={"Authorization": f"Bearer {TOKEN.issue('alice', 'acme', ['user'])}"},
        )
    assert response.status_code == 200, response.text
    return str(response.json()["run"]["status"])


async def wait_status(process: GatewayProcess, run_id: str, status: str) -> None:
    deadline = time.monotonic() + 20
    while (now := await run_status(process, run_id)) != status:
        assert time.monotonic() < deadline, f"run stayed {now}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("bus", ["memory", "redis"])
async def test_a_cancel_through_another_process_ends_the_run_where_it_streams(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess], bus: str
) -> None:
    """B cancels a run A is streaming: B's cancel revokes the run's lease, so A's next write
    is refused and nothing follows `run.cancelled` in the log; over Redis, A is told to stop
    at once."""
    a, b = spawn_with_bus(
        tmp_path,
        database_url,
        processes,
        ("gw-a", "gw-b"),
        GATEWAY_DEMO_DELAY_MS="20",
        **bus_env(bus),
    )
    token = TOKEN.issue("alice", "acme", ["user"])
    starter = await Client.connect(a.ws_url, token)
    canceller = await Client.connect(b.ws_url, token)
    try:
        ack = await starter.request("run.start", input=STORY)
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        await starter.wait_event("message.delta")
        await canceller.request("run.cancel", run_id=run_id)
        await starter.wait_event("run.cancelled", timeout=10)
        await wait_status(a, run_id, "cancelled")
        await asyncio.sleep(1.0)  # A had every chance to write more
        events = starter.events_of(thread_id)
        assert events[-1]["event"] == "run.cancelled"
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert not any(e["event"] == "run.completed" for e in events)

        replay = await Client.connect(b.ws_url, token)
        try:
            await replay.request("thread.subscribe", thread_id=thread_id, after_seq=0)
            await replay.wait_event("run.cancelled")
            assert [(e["seq"], e["event"]) for e in replay.events_of(thread_id)] == [
                (e["seq"], e["event"]) for e in events
            ]
        finally:
            await replay.close()
        assert "Traceback" not in a.log()
        if bus == "redis":
            assert f"run {run_id} was cancelled through another process" in a.log()
    finally:
        await starter.close()
        await canceller.close()


async def test_a_suspend_run_watched_through_another_process_keeps_going(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    """A run with `on_disconnect: "suspend"` streams on A; its starter leaves. While a watcher
    on B remains, A does not suspend it; once that watcher leaves too, A suspends it, and a
    new watcher on B continues it to the end."""
    a, b = spawn_with_bus(
        tmp_path,
        database_url,
        processes,
        ("gw-a", "gw-b"),
        GATEWAY_DEMO_DELAY_MS="15",
        GATEWAY_SUSPEND_GRACE_S="0.3",
        **bus_env("redis"),
    )
    token = TOKEN.issue("alice", "acme", ["user"])

    async def started_and_left(watcher: Client) -> tuple[str, str]:
        starter = await Client.connect(a.ws_url, token)
        ack = await starter.request("run.start", input=STATUS_INPUT, on_disconnect="suspend")
        await watcher.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
        await watcher.wait_event("tool.output")
        await starter.close()
        return ack["thread_id"], ack["run_id"]

    watcher = await Client.connect(b.ws_url, token)
    try:
        thread_id, _ = await started_and_left(watcher)
        await watcher.wait_event("run.completed", timeout=30)
        events = watcher.events_of(thread_id)
        assert not any(e["event"] == "run.paused" for e in events)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))

        thread_id, run_id = await started_and_left(watcher)
        await watcher.close()
        await wait_status(a, run_id, "suspended")
    finally:
        await watcher.close()
    again = await Client.connect(b.ws_url, token)
    try:
        await again.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        await again.wait_event("run.completed", timeout=30)
        events = again.events_of(thread_id)
        paused = [e for e in events if e["event"] == "run.paused"]
        assert [p["data"]["reason"] for p in paused] == ["disconnect"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    finally:
        await again.close()


async def test_a_process_shutting_down_hands_its_runs_over_at_once(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    """SIGTERM to A while it streams a run watched on B: A suspends the run at a turn
    boundary and hands it over on the bus; B or C continues it at once (without the hand-over
    it would wait for A's restart), repeating no tool call."""
    a, b, c = spawn_with_bus(
        tmp_path,
        database_url,
        processes,
        ("gw-a", "gw-b", "gw-c"),
        GATEWAY_DEMO_DELAY_MS="15",
        **bus_env("redis"),
    )
    token = TOKEN.issue("alice", "acme", ["user"])
    starter = await Client.connect(a.ws_url, token)
    watcher = await Client.connect(b.ws_url, token)
    try:
        ack = await starter.request("run.start", input=STATUS_INPUT)
        thread_id = ack["thread_id"]
        await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        await watcher.wait_event("tool.output")
        await asyncio.to_thread(a.terminate)
        paused = await watcher.wait_event("run.paused", timeout=15)
        paused_at = time.monotonic()
        assert paused["data"]["reason"] == "shutdown"
        await watcher.wait_event("run.resumed", timeout=10)
        handed_over_s = time.monotonic() - paused_at
        await watcher.wait_event("run.completed", timeout=30)
        events = watcher.events_of(thread_id)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        calls = [e["data"]["arguments"]["order_id"] for e in events if e["event"] == "tool.called"]
        assert calls == [11, 12, 13, 14, 15]
        assert "handed over by a process shutting down" in b.log() + c.log()
        # Well within the lease's time to live (15 s), which a crash would have to wait out.
        assert handed_over_s < 5.0, handed_over_s
    finally:
        await starter.close()
        await watcher.close()


async def eventually(attempt: Callable[[], Any], what: str, timeout: float = 5.0) -> Any:
    """`attempt()` until it returns something other than None (the relay's delivery)."""
    deadline = time.monotonic() + timeout
    while (outcome := await attempt()) is None:
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)
    return outcome


# Far longer than a usage report takes over a local Redis, even on a loaded machine.
USAGE_HEARD_S = 1.0


async def test_per_user_limits_count_every_process_over_redis(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    """Two connections and two runs a minute per user, on two processes together: alice's
    third connection and third run are refused wherever they go, bob is not affected, and a
    connection closed on one process frees a slot on the other."""
    a, b = spawn_with_bus(
        tmp_path,
        database_url,
        processes,
        ("gw-a", "gw-b"),
        GATEWAY_MAX_CONNECTIONS_PER_USER="2",
        GATEWAY_RUNS_PER_MINUTE="2",
        **bus_env("redis"),
    )
    alice = TOKEN.issue("alice", "acme", ["user"])
    on_a = await Client.connect(a.ws_url, alice)
    on_b = await Client.connect(b.ws_url, alice)
    opened = [on_a, on_b]

    def connecting(url: str) -> Callable[[], Any]:
        async def attempt() -> Client | dict[str, Any]:
            try:
                client = await Client.connect(url, alice)
            except ProtocolFailure as refused:
                return refused.frame
            opened.append(client)
            return client

        return attempt

    async def refused_on(url: str) -> dict[str, Any] | None:
        outcome = await connecting(url)()
        if isinstance(outcome, Client):
            await outcome.close()
            return None
        return outcome

    async def admitted_on(url: str) -> Client | None:
        outcome = await connecting(url)()
        return outcome if isinstance(outcome, Client) else None

    try:
        refusal = await eventually(lambda: refused_on(a.ws_url), "a third connection on A")
        assert refusal["code"] == "rate_limited"
        bob = await Client.connect(a.ws_url, TOKEN.issue("bob", "acme", ["user"]))
        opened.append(bob)

        # A connection closed on B frees a slot on A, and the other way round.
        await on_b.close()
        extra = await eventually(lambda: admitted_on(a.ws_url), "B's closed connection counted")
        await extra.close()
        on_b = await eventually(lambda: admitted_on(b.ws_url), "A's closed connection counted")

        await on_a.request("run.start", input=STORY)
        await on_b.request("run.start", input=STORY)
        # Each process hears of the other's start over the bus, a moment later (a start on
        # the other process within that moment is not yet counted, docs/configuration.md).
        await asyncio.sleep(USAGE_HEARD_S)
        # One run admitted by each process: the refusals are the shared count's.
        for client in (on_a, on_b):
            with pytest.raises(ProtocolFailure) as limited:
                await client.request("run.start", input=STORY)
            assert limited.value.code == "rate_limited"
        assert (await bob.request("run.start", input=STORY))["run_id"]
    finally:
        for client in opened:
            await client.close()


async def test_a_killed_process_s_run_is_taken_over_within_the_lease_ttl_and_scan(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    """kill -9 of A mid-run: nothing tells B, whose lease scan (`GATEWAY_LEASE_SCAN_S`) takes
    the run over once A's lease (`GATEWAY_LEASE_TTL_S`) has expired; a watcher on B sees it
    go on and end, every seq once."""
    ttl_s, scan_s = 2.0, 0.5
    a, b = spawn_with_bus(
        tmp_path,
        database_url,
        processes,
        ("gw-a", "gw-b"),
        GATEWAY_DEMO_DELAY_MS="15",
        GATEWAY_LEASE_TTL_S=str(ttl_s),
        GATEWAY_LEASE_SCAN_S=str(scan_s),
        **bus_env("redis"),
    )
    token = TOKEN.issue("alice", "acme", ["user"])
    starter = await Client.connect(a.ws_url, token)
    watcher = await Client.connect(b.ws_url, token)
    try:
        ack = await starter.request("run.start", input=STATUS_INPUT)
        thread_id = ack["thread_id"]
        await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        await watcher.wait_event("tool.output")
        a.kill()
        killed_at = time.monotonic()
        await watcher.wait_event("run.recovered", timeout=30)
        taken_over_s = time.monotonic() - killed_at
        await watcher.wait_event("run.completed", timeout=30)
        events = watcher.events_of(thread_id)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert "took over 1 run(s) whose lease had expired" in b.log()
        # The lease runs out, the next scan finds it; restoring the run takes the rest.
        assert taken_over_s < ttl_s + scan_s + 5.0, taken_over_s
    finally:
        await starter.close()
        await watcher.close()
