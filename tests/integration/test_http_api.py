"""HTTP endpoints (docs/protocol.md §8): health, the reviewer API, the event log, development
tokens."""

from __future__ import annotations

import time
from typing import Any

import httpx
import jwt
import pytest

from gateway.agents.demo.assistant import refund_text
from tests.support.client import Client, ProtocolFailure, final_text
from tests.support.gateway import TEST_SECRET, Gateway

APPROVAL_KEYS = {
    "approval_id",
    "thread_id",
    "run_id",
    "tool_name",
    "arguments",
    "agent",
    "requested_at",
}


def bearer(gw: Gateway, user: str, *roles: str, tenant: str = "acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {gw.token(user, *roles, tenant=tenant)}"}


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


async def paused_refund(connect: Any, text: str = "refund order 42 for 30") -> tuple:
    alice = await connect("alice", "user")
    ack = await alice.request("run.start", input=text)
    requested = await alice.wait_event("approval.requested")
    await alice.wait_event("run.paused")
    return alice, ack["thread_id"], ack["run_id"], requested["data"]


async def test_health_and_readiness(gateway: Gateway) -> None:
    async with gateway.http() as http:
        health = await http.get("/healthz")
        ready = await http.get("/readyz")
    assert health.status_code == 200
    assert health.headers["content-type"].startswith("application/json")
    assert health.json()["status"] == "ok"
    assert ready.status_code == 200
    assert ready.headers["content-type"].startswith("application/json")
    assert ready.json()["status"] == "ready"


async def test_list_pending_approvals_and_access_rules(gateway: Gateway, connect) -> None:
    _, thread_id, run_id, requested = await paused_refund(connect)
    async with gateway.http() as http:
        response = await http.get(
            "/v1/approvals",
            params={"status": "pending"},
            headers=bearer(gateway, "bob", "reviewer"),
        )
        assert response.status_code == 200
        approvals = response.json()["approvals"]
        assert len(approvals) == 1
        approval = approvals[0]
        assert APPROVAL_KEYS <= set(approval)
        assert approval["approval_id"] == requested["approval_id"]
        assert approval["thread_id"] == thread_id
        assert approval["run_id"] == run_id
        assert approval["tool_name"] == "issue_refund"
        assert approval["arguments"] == {"order_id": 42, "amount": 30.0}
        assert approval["agent"] == "assistant"
        assert approval["requested_at"] == requested["requested_at"]

        # Admins see the inbox too; another tenant's reviewer sees nothing of acme's.
        admin = await http.get("/v1/approvals", headers=bearer(gateway, "carol", "admin"))
        assert [a["approval_id"] for a in admin.json()["approvals"]] == [requested["approval_id"]]
        other = await http.get(
            "/v1/approvals", headers=bearer(gateway, "eve", "reviewer", tenant="globex")
        )
        assert other.status_code == 200 and other.json()["approvals"] == []

        assert_error(
            await http.get("/v1/approvals", headers=bearer(gateway, "alice", "user")),
            403,
            "forbidden",
        )
        assert_error(await http.get("/v1/approvals"), 401, "unauthorized")
        assert_error(
            await http.get("/v1/approvals", headers={"Authorization": "Bearer not.a.jwt"}),
            401,
            "unauthorized",
        )
        assert_error(
            await http.get("/v1/approvals", headers={"Authorization": "Basic Ym9iOnB3"}),
            401,
            "unauthorized",
        )
        # An already expired token, well beyond the verifier's leeway.
        claims = {"sub": "bob", "tenant": "acme", "roles": ["reviewer"]}
        stale = jwt.encode({**claims, "exp": int(time.time()) - 3600}, TEST_SECRET, "HS256")
        assert_error(
            await http.get("/v1/approvals", headers={"Authorization": f"Bearer {stale}"}),
            401,
            "unauthorized",
        )


async def test_decide_over_http(gateway: Gateway, connect) -> None:
    alice, thread_id, run_id, requested = await paused_refund(connect)
    approval_id = requested["approval_id"]
    url = f"/v1/approvals/{approval_id}/decision"
    reviewer = bearer(gateway, "bob", "reviewer")
    async with gateway.http() as http:
        assert_error(
            await http.post(url, json={"decision": "maybe"}, headers=reviewer), 400, "bad_request"
        )
        assert_error(
            await http.post(
                url,
                content=b"{not json",
                headers={**reviewer, "Content-Type": "application/json"},
            ),
            400,
            "bad_request",
        )
        assert_error(await http.post(url, json=["approve"], headers=reviewer), 400, "bad_request")
        assert_error(
            await http.post(url, json={"decision": "approve", "reason": 5}, headers=reviewer),
            400,
            "bad_request",
        )
        assert_error(
            await http.post(
                "/v1/approvals/ap_doesnotexist/decision",
                json={"decision": "approve"},
                headers=reviewer,
            ),
            404,
            "not_found",
        )
        assert_error(
            await http.post(
                url,
                json={"decision": "approve"},
                headers=bearer(gateway, "eve", "reviewer", tenant="globex"),
            ),
            404,
            "not_found",
        )
        assert_error(
            await http.post(url, json={"decision": "approve"}, headers=bearer(gateway, "alice")),
            403,
            "forbidden",
        )
        assert_error(await http.post(url, json={"decision": "approve"}), 401, "unauthorized")
        assert "approval.decided" not in [e["event"] for e in alice.events_of(thread_id)]

        response = await http.post(url, json={"decision": "approve"}, headers=reviewer)
        assert response.status_code == 200, response.text
        approval = response.json()["approval"]
        assert approval["approval_id"] == approval_id
        assert approval["status"] == "approved"
        assert approval["reviewer"] == "bob"

        await alice.wait_event("run.completed")
        decided = await alice.wait_event("approval.decided")
        assert decided["data"]["reviewer"] == "bob"
        assert decided["data"]["decision"] == "approve"
        assert refund_text(42, 30.0) in final_text(alice.events_of(thread_id), run_id)

        assert_error(
            await http.post(url, json={"decision": "reject"}, headers=reviewer), 409, "conflict"
        )
        pending = await http.get("/v1/approvals?status=pending", headers=reviewer)
        assert pending.json()["approvals"] == []


async def test_thread_events_pages_in_frame_shape(gateway: Gateway, connect) -> None:
    alice = await connect("alice", "user")
    # Several turns with tools: enough events to page through however deltas get merged.
    ack = await alice.request("run.start", input="status of 1, 2 and 3")
    thread_id = ack["thread_id"]
    await alice.wait_event("run.completed")
    live = alice.events_of(thread_id)
    head = live[-1]["seq"]
    assert head > 6
    base = f"/v1/threads/{thread_id}/events"
    owner = bearer(gateway, "alice", "user")
    async with gateway.http() as http:
        everything = await http.get(base, headers=owner)
        assert everything.status_code == 200
        body = everything.json()
        assert body["head_seq"] == head
        assert body["events"] == live  # exactly the WebSocket frames

        page = (await http.get(base, params={"after_seq": 2, "limit": 3}, headers=owner)).json()
        assert [e["seq"] for e in page["events"]] == [3, 4, 5]
        assert page["events"] == live[2:5]
        assert page["head_seq"] == head
        for event in page["events"]:
            assert event["type"] == "event"
            assert {"thread_id", "seq", "run_id", "event", "ts", "data"} <= set(event)

        tail = (await http.get(base, params={"after_seq": head}, headers=owner)).json()
        assert tail["events"] == [] and tail["head_seq"] == head

        # Reviewers may read it; another user of the tenant may not; other tenants see nothing.
        as_reviewer = await http.get(
            base, params={"limit": 1}, headers=bearer(gateway, "bob", "reviewer")
        )
        assert [e["seq"] for e in as_reviewer.json()["events"]] == [1]
        assert_error(await http.get(base, headers=bearer(gateway, "mallory")), 403, "forbidden")
        assert_error(
            await http.get(base, headers=bearer(gateway, "alice", "user", tenant="globex")),
            404,
            "not_found",
        )
        assert_error(await http.get(base), 401, "unauthorized")

        for params in (
            {"after_seq": -1},
            {"after_seq": "x"},
            {"limit": 0},
            {"limit": "ten"},
            {"limit": 100_000},
        ):
            assert_error(await http.get(base, params=params, headers=owner), 400, "bad_request")
        assert_error(await http.get("/v1/threads/t_nope/events", headers=owner), 404, "not_found")


async def test_get_run_view_follows_the_run(gateway: Gateway, connect) -> None:
    alice, thread_id, run_id, requested = await paused_refund(connect, "refund order 3 for 4")
    headers = bearer(gateway, "alice", "user")
    async with gateway.http() as http:
        response = await http.get(f"/v1/runs/{run_id}", headers=headers)
        assert response.status_code == 200
        run = response.json()["run"]
        assert run["run_id"] == run_id
        assert run["thread_id"] == thread_id
        assert run["status"] == "waiting_for_review"
        assert run["agent"] == "assistant"
        assert run["checkpoint_version"] == 1
        assert len(run["pending_approvals"]) == 1
        pending = run["pending_approvals"][0]
        assert APPROVAL_KEYS <= set(pending)
        assert pending["approval_id"] == requested["approval_id"]

        decided = await http.post(
            f"/v1/approvals/{requested['approval_id']}/decision",
            json={"decision": "reject", "reason": "no"},
            headers=bearer(gateway, "bob", "reviewer"),
        )
        assert decided.status_code == 200
        assert decided.json()["approval"]["status"] == "rejected"
        await alice.wait_event("run.completed")
        run = (await http.get(f"/v1/runs/{run_id}", headers=headers)).json()["run"]
        assert run["status"] == "completed"
        assert run["pending_approvals"] == []

        assert_error(await http.get("/v1/runs/r_nope", headers=headers), 404, "not_found")
        assert_error(
            await http.get(f"/v1/runs/{run_id}", headers=bearer(gateway, "x", tenant="globex")),
            404,
            "not_found",
        )
        assert_error(await http.get(f"/v1/runs/{run_id}"), 401, "unauthorized")


async def test_dev_token_is_404_when_secret_is_set(gateway: Gateway) -> None:
    async with gateway.http() as http:
        response = await http.post("/v1/dev/token", json={"user": "dana", "roles": ["user"]})
        # Whether tokens are handed out is asked without an error (a sign-in page's question).
        available = await http.get("/v1/dev/token")
    assert_error(response, 404, "not_found")
    assert "token" not in response.json()
    assert available.status_code == 200 and available.json() == {"available": False}


async def test_dev_token_in_development_mode_works_for_hello(
    gateway_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_SECRET", raising=False)
    async with gateway_factory(secret=None) as gw:
        assert gw.settings.dev_mode
        async with gw.http() as http:
            available = await http.get("/v1/dev/token")
            assert available.status_code == 200 and available.json() == {"available": True}
            response = await http.post(
                "/v1/dev/token", json={"user": "dana", "tenant": "acme", "roles": ["user"]}
            )
            assert response.status_code == 200, response.text
            token = response.json()["token"]
            bad = await http.post("/v1/dev/token", json={"user": "dana", "roles": ["king"]})
            assert_error(bad, 400, "bad_request")
        client = await Client.connect(gw.ws_url, token)
        try:
            assert client.welcome["user"] == "dana"
            assert client.welcome["tenant"] == "acme"
            assert client.welcome["roles"] == ["user"]
            ack = await client.request("run.start", input="hi there")
            await client.wait_event("run.completed")
            assert ack["run_id"]
        finally:
            await client.close()
        # A token signed with the fixed test secret is not valid in development mode.
        with pytest.raises(ProtocolFailure) as failure:
            await Client.connect(gw.ws_url, gw.token("alice"))
        assert failure.value.code == "unauthorized"


async def test_dev_token_lifetime_is_chosen_with_ttl_s(
    gateway_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_SECRET", raising=False)
    async with gateway_factory(secret=None) as gw, gw.http() as http:

        async def lifetime(**fields: Any) -> int:
            response = await http.post("/v1/dev/token", json={"user": "dana", **fields})
            assert response.status_code == 200, response.text
            claims = jwt.decode(response.json()["token"], options={"verify_signature": False})
            return int(claims["exp"]) - int(claims["iat"])

        assert await lifetime() == 3600
        assert await lifetime(ttl_s=5) == 5
        assert await lifetime(ttl_s=86400) == 86400
        assert await lifetime(ttl_s=60.0) == 60  # an integer to JSON Schema too
        for bad in (4, 86401, 0, -60, 60.5, 4.0, 1e300, "60", True, None, [60]):
            response = await http.post("/v1/dev/token", json={"user": "dana", "ttl_s": bad})
            assert_error(response, 400, "bad_request")
            assert (
                "ttl_s must be an integer between 5 and 86400"
                in response.json()["error"]["message"]
            ), bad
