"""A token that expires during a long WebSocket connection (docs/protocol.md §3): the server
ends the connection at `exp` (plus GATEWAY_JWT_LEEWAY_S, 0 here) with an `unauthorized` error
and close 4001, unless a new `hello` with a fresh token for the same user and tenant came
first. The HTTP API checks every request, so it refuses the token from then on too."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.client import Client
from tests.support.gateway import Gateway

CLOSE_UNAUTHORIZED = 4001
# Short-lived tokens: `exp` is whole seconds, so a 2 s token has between 1 and 2 s left.
SHORT_TTL_S = 2


@pytest.fixture
async def gw(gateway_factory: Callable[..., Any]) -> Any:
    async with gateway_factory(jwt_leeway_s=0) as gateway:
        yield gateway


async def connect(gw: Gateway, user: str = "alice", *roles: str, ttl_s: int) -> Client:
    return await Client.connect(gw.ws_url, gw.token(user, *roles, ttl_s=ttl_s))


async def rehello(client: Client, token: str, ref: str) -> dict[str, Any]:
    """Send a new hello; return the server's answer to it (a `welcome` or an `error`)."""
    await client.send_raw(json.dumps({"type": "hello", "id": ref, "protocol": 1, "token": token}))
    return await client.wait_for(
        lambda f: f.get("ref") == ref and f.get("type") in ("welcome", "error"), timeout=10
    )


async def closed(client: Client, timeout: float = 10) -> tuple[int | None, str]:
    return await asyncio.wait_for(asyncio.shield(client.closed), timeout)


async def http_status(gw: Gateway, token: str) -> tuple[int, dict[str, Any]]:
    async with gw.http() as http:
        response = await http.get("/v1/threads", headers={"Authorization": f"Bearer {token}"})
    return response.status_code, response.json()


async def test_an_expiring_token_ends_the_connection_with_4001(gw: Gateway) -> None:
    token = gw.token("alice", ttl_s=SHORT_TTL_S)
    started = time.monotonic()
    client = await Client.connect(gw.ws_url, token)
    try:
        created = await client.request("thread.create")
        await client.request("thread.subscribe", thread_id=created["thread_id"])
        assert (await http_status(gw, token))[0] == 200
        code, _ = await closed(client)
        elapsed = time.monotonic() - started
        assert code == CLOSE_UNAUTHORIZED
        assert 0.5 < elapsed < SHORT_TTL_S + 2, elapsed
        errors = [f for f in client.frames if f.get("type") == "error"]
        assert len(errors) == 1, errors
        assert errors[0]["code"] == "unauthorized"
        assert "expired" in errors[0]["message"]
        assert token not in errors[0]["message"]
        # The HTTP API verifies every request: the same token is refused there now too.
        status, body = await http_status(gw, token)
        assert status == 401
        assert body["error"]["code"] == "unauthorized"
        assert "expired" in body["error"]["message"]
    finally:
        await client.close()


async def test_a_new_hello_before_expiry_keeps_the_connection(gw: Gateway) -> None:
    started = time.monotonic()
    client = await connect(gw, "alice", ttl_s=SHORT_TTL_S)
    try:
        renewed_ttl_s = SHORT_TTL_S + 2
        welcome = await rehello(
            client, gw.token("alice", "user", "viewer", ttl_s=renewed_ttl_s), "h2"
        )
        assert welcome["type"] == "welcome", welcome
        assert welcome["user"] == "alice" and welcome["tenant"] == "acme"
        assert welcome["roles"] == ["user", "viewer"]  # the new token's roles apply
        # Past the first token's expiry, the connection still works and streams.
        await asyncio.sleep(max(0.0, SHORT_TTL_S + 0.3 - (time.monotonic() - started)))
        assert not client.closed.done()
        assert (await client.request("ping"))["type"] == "pong"
        ack = await client.request("run.start", input="hello there")
        await client.wait_event("run.completed", timeout=10)
        assert client.events_of(ack["thread_id"])
        # The expiry moved to the new token's: the connection ends then, not before.
        code, _ = await closed(client)
        assert code == CLOSE_UNAUTHORIZED
        assert time.monotonic() - started > SHORT_TTL_S + 0.5
        assert [f["code"] for f in client.frames if f.get("type") == "error"] == ["unauthorized"]
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("user", "tenant"),
    [("mallory", "acme"), ("alice", "globex")],
)
async def test_a_new_hello_for_another_identity_is_refused(
    gw: Gateway, user: str, tenant: str
) -> None:
    client = await connect(gw, "alice", ttl_s=3600)
    try:
        answer = await rehello(client, gw.token(user, "admin", tenant=tenant), "h2")
        assert answer["type"] == "error"
        assert answer["code"] == "unauthorized"
        assert "same user and tenant" in answer["message"]
        code, _ = await closed(client)
        assert code == CLOSE_UNAUTHORIZED
        assert [f for f in client.frames if f.get("type") == "welcome"] == []
    finally:
        await client.close()


async def test_a_new_hello_with_a_bad_token_is_refused(gw: Gateway) -> None:
    client = await connect(gw, "alice", ttl_s=3600)
    try:
        answer = await rehello(client, "not-a-token", "h2")
        assert (answer["type"], answer["code"]) == ("error", "unauthorized")
        assert (await closed(client))[0] == CLOSE_UNAUTHORIZED
    finally:
        await client.close()


async def test_lost_roles_end_subscriptions_they_allowed(gw: Gateway) -> None:
    owner = await connect(gw, "alice", ttl_s=3600)
    reviewer = await connect(gw, "rita", "reviewer", ttl_s=3600)
    try:
        thread_id = (await owner.request("thread.create"))["thread_id"]
        await reviewer.request("thread.subscribe", thread_id=thread_id)
        await reviewer.request("inbox.subscribe")
        # Same user, now without the reviewer role: watching alice's thread is over.
        welcome = await rehello(reviewer, gw.token("rita", "user"), "h2")
        assert welcome["roles"] == ["user"]
        ended = await reviewer.wait_for(
            lambda f: f.get("type") == "error" and f.get("thread_id") == thread_id, timeout=10
        )
        assert ended["code"] == "forbidden"
        assert "subscription ended" in ended["message"]
        inbox = [f for f in reviewer.frames if "inbox" in str(f.get("message", ""))]
        assert inbox and inbox[0]["code"] == "forbidden"
        # The connection itself goes on.
        assert (await reviewer.request("ping"))["type"] == "pong"
        await owner.request("run.start", thread_id=thread_id, input="hello")
        await owner.wait_event("run.completed", timeout=10)
        await reviewer.request("ping")
        assert reviewer.events_of(thread_id) == []
    finally:
        await owner.close()
        await reviewer.close()
