"""Runs started and fed over HTTP (docs/protocol.md §8), followed on the SSE feed: the same
rules, limits and errors as the WebSocket's `run.start` and `run.input`."""

from __future__ import annotations

import asyncio

from tests.integration.test_http_api import assert_error, bearer
from tests.integration.test_sse import is_event, read_until
from tests.support.gateway import Gateway


async def test_a_reviewer_notified_over_http_decides_and_the_feed_shows_it(
    gateway: Gateway,
) -> None:
    alice = bearer(gateway, "alice", "user")
    async with gateway.http() as http:
        started = await http.post(
            "/v1/runs", json={"input": "refund order 42 for 30"}, headers=alice
        )
        assert started.status_code == 200, started.text
        run = started.json()
        assert run["first_seq"] == 1 and run["run_id"] and run["epoch"]
        path = f"/v1/threads/{run['thread_id']}/stream"
        _, events = await asyncio.wait_for(
            read_until(http, path, alice, is_event("run.paused")), 20
        )
        requested = next(e for e in events if e["event"] == "approval.requested")
        decided = await http.post(
            f"/v1/approvals/{requested['data']['approval_id']}/decision",
            json={"decision": "approve"},
            headers=bearer(gateway, "bob", "reviewer"),
        )
        assert decided.status_code == 200, decided.text
        resumed = alice | {"Last-Event-ID": str(events[-1]["seq"])}
        _, rest = await asyncio.wait_for(
            read_until(http, path, resumed, is_event("run.completed")), 20
        )
        assert rest[0]["seq"] == events[-1]["seq"] + 1
        follow_up = await http.post(
            f"/v1/threads/{run['thread_id']}/input", json={"input": "thanks"}, headers=alice
        )
        assert follow_up.status_code == 200, follow_up.text
        assert follow_up.json()["disposition"] == "started"
        assert follow_up.json()["first_seq"] == rest[-1]["seq"] + 1


async def test_bad_bodies_and_access_are_refused_like_frames(gateway: Gateway) -> None:
    alice = bearer(gateway, "alice", "user")
    async with gateway.http() as http:
        assert_error(await http.post("/v1/runs", json={"input": "hi"}), 401, "unauthorized")
        assert_error(await http.post("/v1/runs", json={}, headers=alice), 400, "bad_request")
        assert_error(
            await http.post("/v1/runs", json={"input": "hi", "type": "run.start"}, headers=alice),
            400,
            "bad_request",
        )
        assert_error(
            await http.post(
                "/v1/runs", json={"input": "hi", "on_disconnect": "suspend"}, headers=alice
            ),
            400,
            "bad_request",
        )
        assert_error(
            await http.post("/v1/runs", json={"input": "x" * 10**6}, headers=alice),
            413,
            "too_large",
        )
        assert_error(
            await http.post("/v1/runs", content=b"input=hi", headers=alice),
            415,
            "unsupported_media_type",
        )
        assert_error(
            await http.post(
                "/v1/runs", json={"input": "hi"}, headers=bearer(gateway, "rita", "reviewer")
            ),
            403,
            "forbidden",
        )
        started = (await http.post("/v1/runs", json={"input": "hi"}, headers=alice)).json()
        assert_error(
            await http.post(
                f"/v1/threads/{started['thread_id']}/input",
                json={"input": "hi"},
                headers=bearer(gateway, "mallory", "user"),
            ),
            403,
            "forbidden",
        )
        assert_error(
            await http.post("/v1/threads/t-nope/input", json={"input": "hi"}, headers=alice),
            404,
            "not_found",
        )


async def test_the_run_start_limit_counts_http_starts(gateway_factory) -> None:
    async with gateway_factory(runs_per_minute=1) as gw, gw.http() as http:
        alice = bearer(gw, "alice", "user")
        first = await http.post("/v1/runs", json={"input": "hi"}, headers=alice)
        assert first.status_code == 200, first.text
        second = await http.post("/v1/runs", json={"input": "hi"}, headers=alice)
        assert_error(second, 429, "rate_limited")
        assert second.json()["error"]["retry_after_s"] > 0
