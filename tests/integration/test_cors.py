"""Browser apps on their own origin (docs/frontend.md "A frontend on its own origin"): CORS on
the HTTP API and both WebSockets (the native one and the AI SDK's) for the allowed origins, the
usual local dev servers' origins in development mode, and a refused origin named in the log with
the setting that allows it."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from tests.support.client import Client
from tests.support.gateway import Gateway

VITE = "http://localhost:5173"


async def preflight(
    gw: Gateway, path: str, origin: str, method: str, headers: str
) -> httpx.Response:
    async with gw.http() as http:
        return await http.options(
            path,
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": method,
                "Access-Control-Request-Headers": headers,
            },
        )


async def dev_token(gw: Gateway, origin: str) -> httpx.Response:
    async with gw.http() as http:
        return await http.post(
            "/v1/dev/token", json={"user": "vera", "roles": ["user"]}, headers={"Origin": origin}
        )


async def ai_sdk_chat(gw: Gateway, token: str, origin: str) -> list[dict[str, Any]]:
    """One `useChat` request on the AI SDK's WebSocket, opened from `origin`; its frames."""
    url = gw.ws_url.replace("/v1/ws", "/v1/ai-sdk/ws")
    async with websockets.connect(url, origin=Origin(origin)) as socket:
        await socket.send(
            json.dumps(
                {
                    "type": "send",
                    "requestId": "r1",
                    "id": f"chat-{secrets.token_hex(4)}",
                    "headers": {"authorization": f"Bearer {token}"},
                    "body": {},
                    "trigger": "submit-message",
                    "messages": [
                        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hello"}]}
                    ],
                }
            )
        )
        frames = [json.loads(await asyncio.wait_for(socket.recv(), 10))]
        while frames[-1]["type"] not in ("end", "error"):
            frames.append(json.loads(await asyncio.wait_for(socket.recv(), 10)))
    return frames


@pytest.mark.parametrize("origin", [VITE, "http://127.0.0.1:5173", "http://localhost:3000"])
async def test_development_mode_serves_a_local_dev_server_app(
    gateway_factory: Callable[..., Any], origin: str
) -> None:
    async with gateway_factory(secret=None) as gw:
        # The preflight of the app's token request, then the request itself.
        answer = await preflight(gw, "/v1/dev/token", origin, "POST", "content-type")
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == origin
        assert "POST" in answer.headers["access-control-allow-methods"]
        minted = await dev_token(gw, origin)
        assert minted.status_code == 200
        assert minted.headers["access-control-allow-origin"] == origin
        token = minted.json()["token"]

        # The HTTP API with a bearer token: listing threads, and a thread's SSE feed.
        answer = await preflight(gw, "/v1/threads", origin, "GET", "authorization")
        assert answer.status_code == 200
        assert "authorization" in answer.headers["access-control-allow-headers"].lower()
        client = await Client.connect(gw.ws_url, token, origin=origin)
        try:
            ack = await client.request("run.start", input="hello")
            await client.wait_event("run.completed")
        finally:
            await client.close()
        auth = {"Authorization": f"Bearer {token}", "Origin": origin}
        async with gw.http() as http:
            listed = await http.get("/v1/threads", headers=auth)
            assert listed.status_code == 200
            assert listed.headers["access-control-allow-origin"] == origin
            assert [t["thread_id"] for t in listed.json()["threads"]] == [ack["thread_id"]]
            stream = f"/v1/threads/{ack['thread_id']}/stream"
            async with http.stream("GET", stream, headers=auth) as feed:
                assert feed.status_code == 200
                assert feed.headers["access-control-allow-origin"] == origin
        # The AI SDK's WebSocket takes the same origins as the native one.
        frames = await ai_sdk_chat(gw, token, origin)
        assert frames[0]["chunk"]["type"] == "start" and frames[-1]["type"] == "end", frames
        chunks = [f["chunk"] for f in frames if f["type"] == "chunk"]
        assert {"text-delta", "finish"} <= {chunk["type"] for chunk in chunks}


async def test_an_unlisted_origin_gets_no_cors_and_the_log_says_which_setting(
    gateway_factory: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.websocket")
    # With a secret (production), the dev servers' origins are not allowed by default.
    async with gateway_factory() as gw:
        answer = await preflight(gw, "/v1/threads", VITE, "GET", "authorization")
        assert answer.status_code in (400, 405)
        assert "access-control-allow-origin" not in answer.headers
        for _ in range(3):
            with pytest.raises(InvalidStatus) as refused:
                await websockets.connect(gw.ws_url, origin=Origin(VITE))
            assert refused.value.response.status_code == 403
            # The AI SDK's WebSocket refuses it too, under the same rule.
            with pytest.raises(InvalidStatus) as refused:
                await ai_sdk_chat(gw, gw.token("amy"), VITE)
            assert refused.value.response.status_code == 403
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.websocket"]
    # One line for the origin, however often its page retries and on whichever socket.
    assert len(lines) == 1, lines
    assert "'http://localhost:5173'" in lines[0] and "GATEWAY_ALLOWED_ORIGINS" in lines[0]


async def test_allowed_origins_get_cors_in_production(gateway_factory: Callable[..., Any]) -> None:
    app = "https://chat.example.com"
    async with gateway_factory(allowed_origins=[app + "/"]) as gw:
        answer = await preflight(
            gw, "/v1/approvals/ap_x/decision", app, "POST", "authorization, content-type"
        )
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == app
        async with gw.http() as http:
            listed = await http.get(
                "/v1/threads",
                headers={"Authorization": f"Bearer {gw.token('amy')}", "Origin": app},
            )
        assert listed.status_code == 200
        assert listed.headers["access-control-allow-origin"] == app
        client = await Client.connect(gw.ws_url, gw.token("amy"), origin=app)
        await client.close()
        # The listed origin, written with a trailing slash, opens the AI SDK's socket too.
        frames = await ai_sdk_chat(gw, gw.token("amy"), app)
        assert frames[-1]["type"] == "end", frames
        # Another origin is still refused, by CORS and on the WebSocket.
        other = await preflight(gw, "/v1/threads", "https://evil.example", "GET", "authorization")
        assert "access-control-allow-origin" not in other.headers
        with pytest.raises(InvalidStatus):
            await websockets.connect(gw.ws_url, origin=Origin(VITE))
        with pytest.raises(InvalidStatus):
            await ai_sdk_chat(gw, gw.token("amy"), VITE)
