"""Abuse limits against a real gateway (docs/protocol.md §7): each is hit, answered with its
code, and afterwards the connection or the user is served again.

Every test turns on only the limit it is about, with small numbers to stay fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import websockets

from gateway.protocol.close_codes import CloseCode
from tests.support.client import Client, Opener, ProtocolFailure, clients
from tests.support.gateway import Gateway

PAUSING_INPUT = "refund order 42 for 30"


def errors_of(client: Client) -> list[dict[str, Any]]:
    return [f for f in client.frames if f.get("type") == "error"]


async def reply_to(client: Client, ref: str) -> dict[str, Any]:
    return await client.wait_for(lambda f: f.get("ref") == ref, timeout=10)


async def refused(client: Client, type_: str, code: str = "rate_limited", **fields: Any) -> Any:
    with pytest.raises(ProtocolFailure) as failure:
        await client.request(type_, **fields)
    assert failure.value.code == code, failure.value.frame
    return failure.value.frame


async def threads_of(gateway: Gateway, user: str) -> list[str]:
    async with gateway.http() as http:
        response = await http.get(
            "/v1/threads", headers={"Authorization": f"Bearer {gateway.token(user)}"}
        )
    assert response.status_code == 200
    return [t["thread_id"] for t in response.json()["threads"]]


async def head_seq(gateway: Gateway, user: str, thread_id: str) -> int:
    async with gateway.http() as http:
        response = await http.get(
            f"/v1/threads/{thread_id}/events",
            headers={"Authorization": f"Bearer {gateway.token(user)}"},
        )
    return int(response.json()["head_seq"])


async def eventually_connect(open_client: Opener, user: str, timeout: float = 10) -> Client:
    """The server notices a closed socket a moment after the client: retry while refused."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await open_client(user)
        except ProtocolFailure as failure:
            assert failure.code == "rate_limited", failure.frame
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def raw_hello(gateway: Gateway, user: str) -> tuple[dict[str, Any], int | None]:
    """A hello on a fresh socket: the first frame back and the close code that followed."""
    async with websockets.connect(gateway.ws_url) as ws:
        token = gateway.token(user)
        await ws.send(json.dumps({"type": "hello", "id": "h1", "protocol": 1, "token": token}))
        first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        with contextlib.suppress(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
        received = ws.protocol.close_rcvd
        return first, received.code if received else None


async def send_all(client: Client, frames: list[str]) -> None:
    with contextlib.suppress(websockets.ConnectionClosed):
        for frame in frames:
            await client.send_raw(frame)


# -- frames per second ---------------------------------------------------------------------------


async def test_frames_over_the_rate_are_refused_unprocessed_then_served_again(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(frames_per_s=1, frame_burst=3) as gw, clients(gw) as open_client:
        alice = await open_client("alice")
        await send_all(alice, [json.dumps({"type": "ping", "id": f"p{i}"}) for i in range(3)])
        await send_all(alice, [json.dumps({"type": "thread.create", "id": "c1"})])
        pongs = [await reply_to(alice, f"p{i}") for i in range(3)]
        assert [p["type"] for p in pongs] == ["pong"] * 3
        error = await reply_to(alice, "c1")
        assert error["type"] == "error" and error["code"] == "rate_limited", error
        assert 0 < error["retry_after_s"] <= 1.0
        # The refused frame was not handled: no thread exists.
        assert await threads_of(gw, "alice") == []

        await asyncio.sleep(error["retry_after_s"])
        created = await alice.request("thread.create")
        assert await threads_of(gw, "alice") == [created["thread_id"]]
        assert not alice.closed.done()


async def test_a_client_that_keeps_flooding_is_closed_with_4008(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(frames_per_s=1, frame_burst=3) as gw, clients(gw) as open_client:
        alice = await open_client("alice")
        await send_all(alice, [json.dumps({"type": "ping", "id": f"p{i}"}) for i in range(50)])
        code, _ = await asyncio.wait_for(alice.closed, 10)
        assert code == CloseCode.FLOODING == 4008
        # At most the burst is served, then refusals, then the close. Answers still queued when
        # the flooder is cut off are dropped with the socket, so only upper bounds are exact
        # (the unit tests of gateway/abuse/limits.py pin the bucket's arithmetic).
        kinds = [f["type"] for f in alice.frames]
        assert kinds.count("pong") <= 4
        assert all(e["code"] == "rate_limited" for e in errors_of(alice))
        assert len(errors_of(alice)) <= 5
        assert kinds.count("pong") + len(errors_of(alice)) < 50
        # The user is not punished beyond that socket.
        again = await open_client("alice")
        assert (await again.request("ping"))["type"] == "pong"


async def test_pongs_answering_heartbeats_are_free_other_pongs_count(
    gateway_factory: Callable[..., Any],
) -> None:
    async with (
        gateway_factory(frames_per_s=1, frame_burst=2, heartbeat_s=0.05) as gw,
        clients(gw) as open_client,
    ):
        # The test client answers every ping: ~20 pongs a second against a rate of 1.
        alice = await open_client("alice")
        await asyncio.sleep(1.5)
        pings = [f for f in alice.frames if f["type"] == "ping"]
        assert len(pings) >= 10
        assert errors_of(alice) == []
        assert not alice.closed.done()
        assert (await alice.request("ping"))["type"] == "pong"

    async with gateway_factory(frames_per_s=1, frame_burst=2) as gw, clients(gw) as open_client:
        # No ping was sent, so these pongs are ordinary traffic.
        bob = await open_client("bob")
        await send_all(bob, ['{"type": "pong"}'] * 4)
        await bob.wait_for(lambda f: len(errors_of(bob)) >= 1, timeout=10)
        errors = errors_of(bob)
        assert errors[0]["code"] == "rate_limited" and errors[0]["ref"] is None


# -- runs per user per minute --------------------------------------------------------------------


async def test_run_starts_per_minute(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(runs_per_minute=2) as gw, clients(gw) as open_client:
        alice = await open_client("alice")
        bob = await open_client("bob", "reviewer")
        first_start = time.monotonic()
        paused = await alice.request("run.start", input=PAUSING_INPUT)
        await alice.wait_event("run.paused")
        second = await alice.request("run.start", input="hello there")
        await alice.wait_for(
            lambda f: f.get("event") == "run.completed" and f["run_id"] == second["run_id"]
        )

        error = await refused(alice, "run.start", input="one more")
        # The hint is when the first start leaves the one-minute window.
        assert 60 - (time.monotonic() - first_start) - 0.1 <= error["retry_after_s"] <= 60
        assert "2 runs" in error["message"]
        # A run.input that would start a run counts too...
        await refused(alice, "run.input", thread_id=second["thread_id"], input="again")
        # ...one that joins a paused run does not start anything, so it does not.
        staged = await alice.request("run.input", thread_id=paused["thread_id"], input="also")
        assert staged["disposition"] == "staged"

        # Nothing was created by the refused starts; the socket serves everything else.
        assert sorted(await threads_of(gw, "alice")) == sorted(
            [paused["thread_id"], second["thread_id"]]
        )
        assert (await alice.request("thread.create"))["thread_id"]
        # Other users have their own budget.
        carol = await open_client("carol")
        assert (await carol.request("run.start", input="hi"))["run_id"]
        # Finishing runs gives nothing back: the budget is for starts.
        await bob.request(
            "approval.decide",
            approval_id=(await alice.wait_event("approval.requested"))["data"]["approval_id"],
            decision="approve",
        )
        await alice.wait_for(
            lambda f: f.get("event") == "run.completed" and f["run_id"] == paused["run_id"]
        )
        await refused(alice, "run.start", input="still too soon")


# -- connections per user ------------------------------------------------------------------------


async def test_connections_per_user_refused_after_hello_then_freed_on_close(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(max_connections_per_user=2) as gw, clients(gw) as open_client:
        first = await open_client("alice")
        second = await open_client("alice")
        frame, code = await raw_hello(gw, "alice")
        assert frame["type"] == "error" and frame["code"] == "rate_limited"
        assert frame["ref"] == "h1"
        assert code == CloseCode.TOO_MANY_CONNECTIONS == 4029
        bob = await open_client("bob")
        assert bob.welcome["user"] == "bob"

        # A clean close frees a slot...
        await first.close()
        third = await eventually_connect(open_client, "alice")
        # ...so does a connection that just drops (no close frame).
        second.ws.transport.abort()
        fourth = await eventually_connect(open_client, "alice")
        # The refused sockets never held one: the limit is exactly 2 again.
        frame, code = await raw_hello(gw, "alice")
        assert frame["code"] == "rate_limited" and code == 4029
        assert (await third.request("ping"))["type"] == "pong"
        assert (await fourth.request("ping"))["type"] == "pong"


async def test_server_side_closes_free_the_connection_slot(
    gateway_factory: Callable[..., Any],
) -> None:
    async with (
        gateway_factory(
            max_connections_per_user=1, frames_per_s=1, frame_burst=2, max_frame_bytes=1024
        ) as gw,
        clients(gw) as open_client,
    ):
        flooder = await open_client("alice")
        await send_all(flooder, ['{"type": "ping"}'] * 30)
        assert (await asyncio.wait_for(flooder.closed, 10))[0] == CloseCode.FLOODING

        oversized = await eventually_connect(open_client, "alice")
        await send_all(oversized, [json.dumps({"type": "ping", "pad": "x" * 2000})])
        assert (await asyncio.wait_for(oversized.closed, 10))[0] == 1009

        last = await eventually_connect(open_client, "alice")
        assert (await last.request("ping"))["type"] == "pong"


# -- subscriptions per connection ----------------------------------------------------------------


async def test_subscriptions_per_connection(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(max_subscriptions=2) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user", "reviewer")
        t1, t2, t3 = [(await alice.request("thread.create"))["thread_id"] for _ in range(3)]
        await alice.request("thread.subscribe", thread_id=t1)
        await alice.request("thread.subscribe", thread_id=t2)
        error = await refused(alice, "thread.subscribe", thread_id=t3)
        assert "2 thread subscriptions" in error["message"] and "retry_after_s" not in error
        # Subscribing again to a thread already watched takes no new slot.
        await alice.request("thread.subscribe", thread_id=t1, after_seq=0)
        # The approval inbox does not count.
        await alice.request("inbox.subscribe")
        # A run on a new thread would need a slot for its events: refused before it starts.
        await refused(alice, "run.start", input="hello")
        assert sorted(await threads_of(gw, "alice")) == sorted([t1, t2, t3])
        # On a watched thread it needs none.
        started = await alice.request("run.start", thread_id=t1, input="hello")
        await alice.wait_for(
            lambda f: f.get("event") == "run.completed" and f["run_id"] == started["run_id"]
        )

        await alice.request("thread.unsubscribe", thread_id=t1)
        await alice.request("thread.subscribe", thread_id=t3)
        await alice.request("thread.unsubscribe", thread_id=t2)
        fresh = await alice.request("run.start", input="hello again")
        await alice.wait_for(
            lambda f: f.get("event") == "run.completed" and f["run_id"] == fresh["run_id"]
        )


# -- input length --------------------------------------------------------------------------------


async def test_input_over_max_input_chars_is_too_large(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(max_input_chars=10) as gw, clients(gw) as open_client:
        alice = await open_client("alice")
        error = await refused(alice, "run.start", code="too_large", input="x" * 11)
        assert error["message"] == "field 'input': must be at most 10 characters"
        assert await threads_of(gw, "alice") == []

        thread_id = (await alice.request("thread.create"))["thread_id"]
        await refused(alice, "run.input", code="too_large", thread_id=thread_id, input="y" * 11)
        assert await head_seq(gw, "alice", thread_id) == 0

        started = await alice.request("run.input", thread_id=thread_id, input="x" * 10)
        assert started["disposition"] == "started"


# -- pending inputs per thread -------------------------------------------------------------------


async def test_staged_inputs_per_thread(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(max_pending_inputs=2) as gw, clients(gw) as open_client:
        alice = await open_client("alice")
        bob = await open_client("bob", "reviewer")
        ack = await alice.request("run.start", input=PAUSING_INPUT)
        requested = await alice.wait_event("approval.requested")
        await alice.wait_event("run.paused")
        thread_id = ack["thread_id"]
        for text in ("first", "second"):
            staged = await alice.request("run.input", thread_id=thread_id, input=text)
            assert staged["disposition"] == "staged"
        head = await head_seq(gw, "alice", thread_id)
        error = await refused(alice, "run.input", thread_id=thread_id, input="third")
        assert "2 inputs waiting" in error["message"]
        assert await head_seq(gw, "alice", thread_id) == head  # no input.staged was logged

        # Once the run has taken them, the thread accepts input again.
        await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed")
        again = await alice.request("run.input", thread_id=thread_id, input="third")
        assert again["disposition"] == "started"


async def test_queued_inputs_per_thread(gateway_factory: Callable[..., Any]) -> None:
    async with (
        gateway_factory(max_pending_inputs=2, demo_delay_ms=50) as gw,
        clients(gw) as open_client,
    ):
        alice = await open_client("alice")
        ack = await alice.request("run.start", input="tell me a story about rivers")
        thread_id = ack["thread_id"]
        for text in ("q one", "q two"):
            queued = await alice.request("run.input", thread_id=thread_id, input=text)
            assert queued["disposition"] == "queued"
        await refused(alice, "run.input", thread_id=thread_id, input="q three")

        # The queue drains as runs end: each queued input becomes the next run.
        await alice.request("run.cancel", run_id=ack["run_id"])
        await alice.wait_for(
            lambda f: f.get("event") == "run.started" and f["data"].get("input") == "q two",
            timeout=30,
        )
        accepted = await alice.request("run.input", thread_id=thread_id, input="q three")
        # Queued behind "q two", or started if that short run already ended.
        assert accepted["disposition"] in ("queued", "started")
        await alice.wait_for(
            lambda f: f.get("event") == "run.started" and f["data"].get("input") == "q three",
            timeout=30,
        )
        assert len(await threads_of(gw, "alice")) == 1
