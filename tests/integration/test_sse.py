"""The SSE thread feed (docs/protocol.md §8) on a real server, read by a real HTTP client that
drops the feed and resumes it with `Last-Event-ID`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.integration.test_http_api import assert_error, bearer, paused_refund
from tests.support.client import Client
from tests.support.gateway import Gateway


@dataclass
class Message:
    event: str = "message"
    id: int | None = None
    data: list[str] = field(default_factory=list)
    comment: bool = False

    @property
    def frame(self) -> dict[str, Any]:
        return dict(json.loads("\n".join(self.data)))


async def messages(response: httpx.Response) -> AsyncIterator[Message]:
    """SSE messages as an EventSource would dispatch them; comments too, to see heartbeats."""
    current = Message()
    async for line in response.aiter_lines():
        if line == "":
            if current.data or current.comment:
                yield current
            current = Message()
        elif line.startswith(":"):
            current.comment = True
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                current.event = value
            elif name == "id":
                current.id = int(value)
            elif name == "data":
                current.data.append(value)


async def read_until(
    http: httpx.AsyncClient,
    path: str,
    headers: dict[str, str],
    stop: Callable[[dict[str, Any]], bool],
    *,
    params: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Open the feed, read the `subscribed` frame and events until `stop`, then drop it."""
    events: list[dict[str, Any]] = []
    subscribed: dict[str, Any] = {}
    async with http.stream("GET", path, headers=headers, params=params) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for message in messages(response):
            if message.comment:
                continue
            if message.event == "subscribed":
                subscribed = message.frame
                continue
            frame = message.frame
            assert message.id == frame["seq"]
            events.append(frame)
            if stop(frame):
                break
    return subscribed, events


def is_event(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda frame: frame["event"] == name


async def test_feed_drops_and_resumes_without_gap_or_repeat(gateway: Gateway, connect) -> None:
    alice, thread_id, run_id, requested = await paused_refund(connect)
    path = f"/v1/threads/{thread_id}/stream"
    headers = bearer(gateway, "alice", "user")
    async with gateway.http() as http:
        subscribed, first = await asyncio.wait_for(
            read_until(http, path, headers, is_event("approval.requested")), 20
        )
        assert subscribed["type"] == "subscribed" and subscribed["reset"] is False
        assert [e["seq"] for e in first] == list(range(1, len(first) + 1))
        # The feed is gone; the run goes on while nobody watches it.
        decided = await http.post(
            f"/v1/approvals/{requested['approval_id']}/decision",
            json={"decision": "approve"},
            headers=bearer(gateway, "bob", "reviewer"),
        )
        assert decided.status_code == 200, decided.text
        await alice.wait_event("run.completed")
        resumed_headers = headers | {"Last-Event-ID": str(first[-1]["seq"])}
        again, rest = await asyncio.wait_for(
            read_until(http, path, resumed_headers, is_event("run.completed")), 20
        )
        assert again["reset"] is False and again["epoch"] == subscribed["epoch"]
        log = (await http.get(f"/v1/threads/{thread_id}/events", headers=headers)).json()
    received = first + rest
    assert [e["seq"] for e in received] == list(range(1, len(received) + 1))
    assert received == log["events"]
    assert all(e["run_id"] == run_id for e in received if e["run_id"] is not None)


async def test_feed_follows_live_events(gateway: Gateway, connect) -> None:
    _, thread_id, _, requested = await paused_refund(connect)
    headers = bearer(gateway, "alice", "user")
    async with gateway.http() as http:
        head = (await http.get(f"/v1/threads/{thread_id}/events", headers=headers)).json()
        reader = asyncio.create_task(
            read_until(
                http,
                f"/v1/threads/{thread_id}/stream",
                headers,
                is_event("run.completed"),
                params={"after_seq": str(head["head_seq"])},
            )
        )
        await asyncio.sleep(0.3)  # the feed is open and live before the run continues
        decided = await http.post(
            f"/v1/approvals/{requested['approval_id']}/decision",
            json={"decision": "reject"},
            headers=bearer(gateway, "bob", "reviewer"),
        )
        assert decided.status_code == 200, decided.text
        subscribed, events = await asyncio.wait_for(reader, 20)
    assert subscribed["head_seq"] == head["head_seq"]
    assert events[0]["seq"] == head["head_seq"] + 1
    assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[-1]["seq"] + 1))


async def test_another_epoch_or_a_cursor_past_the_head_resets(gateway: Gateway, connect) -> None:
    _, thread_id, _, _ = await paused_refund(connect)
    path = f"/v1/threads/{thread_id}/stream"
    headers = bearer(gateway, "alice", "user")
    async with gateway.http() as http:
        for params, extra in (
            ({"epoch": "e-somewhere-else"}, {"Last-Event-ID": "2"}),
            ({}, {"Last-Event-ID": "100000"}),
        ):
            subscribed, events = await asyncio.wait_for(
                read_until(http, path, headers | extra, is_event("run.paused"), params=params), 20
            )
            assert subscribed["reset"] is True
            assert events[0]["seq"] == 1


async def test_heartbeats_on_an_idle_feed(gateway_factory, tmp_path) -> None:
    async with gateway_factory(heartbeat_s=0.2) as gw, gw.http() as http:
        created = await _thread(gw)
        seen = 0
        async with http.stream(
            "GET", f"/v1/threads/{created}/stream", headers=bearer(gw, "alice", "user")
        ) as response:
            async for message in messages(response):
                if message.comment:
                    seen += 1
                    if seen == 3:
                        break
    assert seen == 3


async def _thread(gw: Gateway) -> str:
    from tests.support.client import Client

    client = await Client.connect(gw.ws_url, gw.token("alice", "user"))
    try:
        ack = await client.request("thread.create")
        return str(ack["thread_id"])
    finally:
        await client.close()


async def test_feed_access_and_bad_cursors(gateway: Gateway, connect) -> None:
    _, thread_id, _, _ = await paused_refund(connect)
    path = f"/v1/threads/{thread_id}/stream"
    async with gateway.http() as http:
        assert_error(await http.get(path), 401, "unauthorized")
        assert_error(
            await http.get(path, headers=bearer(gateway, "mallory", "user")), 403, "forbidden"
        )
        assert_error(
            await http.get(path, headers=bearer(gateway, "eve", "reviewer", tenant="other")),
            404,
            "not_found",
        )
        assert_error(
            await http.get("/v1/threads/t-nope/stream", headers=bearer(gateway, "alice", "user")),
            404,
            "not_found",
        )
        alice = bearer(gateway, "alice", "user")
        assert_error(
            await http.get(path, headers=alice | {"Last-Event-ID": "x"}), 400, "bad_request"
        )
        assert_error(
            await http.get(path, params={"after_seq": "-1"}, headers=alice), 400, "bad_request"
        )


async def test_a_reviewer_follows_the_inbox_feed_and_decides_over_http(gateway: Gateway) -> None:
    bob = bearer(gateway, "bob", "reviewer")
    seen: list[Message] = []
    async with gateway.http() as http:
        assert_error(
            await http.get("/v1/approvals/stream", headers=bearer(gateway, "alice", "user")),
            403,
            "forbidden",
        )
        async with http.stream("GET", "/v1/approvals/stream", headers=bob) as response:
            assert response.status_code == 200
            feed = messages(response)
            first = await asyncio.wait_for(anext(feed), 10)
            assert first.event == "inbox" and first.frame["approvals"] == []
            started = await http.post(
                "/v1/runs",
                json={"input": "refund order 42 for 30"},
                headers=bearer(gateway, "alice", "user"),
            )
            assert started.status_code == 200, started.text
            while True:
                message = await asyncio.wait_for(anext(feed), 10)
                seen.append(message)
                if message.event == "inbox.update" and message.frame["added"]:
                    break
            approval = message.frame["added"][0]
            assert approval["tool_name"] == "issue_refund" and approval["can_decide"] is True
            decided = await http.post(
                f"/v1/approvals/{approval['approval_id']}/decision",
                json={"decision": "approve"},
                headers=bob,
            )
            assert decided.status_code == 200, decided.text
            while True:
                message = await asyncio.wait_for(anext(feed), 10)
                if message.event == "inbox.update" and message.frame["removed"]:
                    break
            assert message.frame["removed"] == [approval["approval_id"]]


async def test_a_feed_ends_when_its_token_expires(gateway_factory) -> None:
    async with gateway_factory(jwt_leeway_s=0, heartbeat_s=0.2) as gw, gw.http() as http:
        thread_id = await _thread(gw)
        headers = {"Authorization": f"Bearer {gw.token('alice', 'user', ttl_s=2)}"}
        loop = asyncio.get_running_loop()
        opened = loop.time()
        async with http.stream("GET", f"/v1/threads/{thread_id}/stream", headers=headers) as r:
            assert r.status_code == 200
            async for _ in messages(r):
                pass  # heartbeats until the server ends the feed
        assert 1.0 < loop.time() - opened < 5
        # The same token is refused from then on; a fresh one resumes.
        assert_error(
            await http.get(f"/v1/threads/{thread_id}/stream", headers=headers), 401, "unauthorized"
        )


async def test_feeds_count_as_open_connections(gateway_factory) -> None:
    async with gateway_factory(max_connections_per_user=1) as gw, gw.http() as http:
        thread_id = await _thread(gw)
        path = f"/v1/threads/{thread_id}/stream"
        alice = bearer(gw, "alice", "user")
        async with http.stream("GET", path, headers=alice) as held:
            assert held.status_code == 200
            assert_error(await http.get(path, headers=alice), 429, "rate_limited")
        # The slot is free once the feed is gone (released as the server sees it close).
        for _ in range(50):
            async with http.stream("GET", path, headers=alice) as again:
                if again.status_code == 200:
                    break
            await asyncio.sleep(0.1)
        assert again.status_code == 200


async def test_an_inbox_feed_too_far_behind_its_updates_ends_with_its_last_word(
    gateway_factory: Callable[..., Any],
) -> None:
    """The inbox has no cursor: a reader so far behind that an update no longer fits its queue
    is ended, as a WebSocket is (4009), with `event: end` after what it was sent, and reads a
    fresh snapshot when it reconnects."""
    from tests.support.hostile import never_reading_feed, read_all

    async with gateway_factory(
        socket_sndbuf=4096, send_queue_size=16, send_queue_bytes=65536, send_timeout_s=120
    ) as gw:
        sock = never_reading_feed(gw.port, "/v1/approvals/stream", gw.token("bob", "reviewer"))
        try:
            alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
            try:
                # Each pause's e-mail quotes its input: inbox updates of about 30 KB each.
                for _ in range(12):
                    ack = await alice.request(
                        "run.start", input="email ann@example.com " + "x" * 30_000
                    )
                    await alice.wait_for(
                        lambda f, run_id=ack["run_id"]: (
                            f.get("event") == "run.paused" and f["run_id"] == run_id
                        )
                    )
            finally:
                await alice.close()
            received = await asyncio.to_thread(read_all, sock, 5)
        finally:
            sock.close()
    assert b"event: inbox\n" in received
    tail = received[-2000:]
    assert b"event: end\n" in tail, tail[-300:]
    end = json.loads(tail.split(b"event: end\n")[-1].split(b"data: ", 1)[1].split(b"\n")[0])
    assert end["type"] == "end" and end["code"] == 4009, end
    assert tail.endswith(b"0\r\n\r\n"), tail[-50:]
