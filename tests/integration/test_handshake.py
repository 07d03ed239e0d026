"""The WebSocket handshake (docs/protocol.md §3): hello, tokens, protocol version, Origin; and
settings validation at start-up."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
import websockets
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from gateway.auth.access import TokenVerifier
from tests.support.client import Client
from tests.support.fork_server import Finished, run_gateway_command
from tests.support.gateway import ROOT, TEST_SECRET, Gateway

CLOSE_UNAUTHORIZED = 4001


async def refused_handshake(
    gw: Gateway, *frames: str | bytes
) -> tuple[list[dict[str, Any]], int | None]:
    """Send `frames` raw, collect what the server answers until it closes; return the frames
    and the close code."""
    received: list[dict[str, Any]] = []
    async with websockets.connect(gw.ws_url) as ws:
        for frame in frames:
            await ws.send(frame)

        async def drain() -> None:
            try:
                async for raw in ws:
                    received.append(json.loads(raw))
            except websockets.ConnectionClosed:
                pass  # a non-1000 close ends the iteration with an exception

        await asyncio.wait_for(drain(), 10)
        rcvd = ws.protocol.close_rcvd
        return received, rcvd.code if rcvd else None


def hello(token: str, protocol: Any = 1) -> str:
    return json.dumps({"type": "hello", "protocol": protocol, "token": token})


def assert_refused(frames: list[dict[str, Any]], code: int | None, error_code: str) -> None:
    assert code == CLOSE_UNAUTHORIZED
    assert len(frames) == 1, frames
    assert frames[0]["type"] == "error"
    assert frames[0]["code"] == error_code
    assert "welcome" not in [f["type"] for f in frames]


async def test_no_hello_within_timeout_closes_4001(gateway_factory) -> None:
    async with gateway_factory(hello_timeout_s=0.5) as gw:
        started = time.monotonic()
        frames, code = await refused_handshake(gw)
        elapsed = time.monotonic() - started
    assert code == CLOSE_UNAUTHORIZED
    assert 0.3 < elapsed < 5
    assert all(f["type"] == "error" for f in frames)


async def test_first_frame_not_hello_closes_4001(gateway: Gateway) -> None:
    frames, code = await refused_handshake(gateway, json.dumps({"type": "ping", "id": "p1"}))
    assert code == CLOSE_UNAUTHORIZED
    assert [f["type"] for f in frames] == ["error"]
    assert "pong" not in [f["type"] for f in frames]


async def test_malformed_first_frame_closes_4001(gateway: Gateway) -> None:
    frames, code = await refused_handshake(gateway, "this is not json")
    assert code == CLOSE_UNAUTHORIZED
    assert [f["type"] for f in frames] == ["error"]


async def test_binary_first_frame_closes_4001(gateway: Gateway) -> None:
    first = hello(gateway.token("alice")).encode()
    frames, code = await refused_handshake(gateway, first)
    assert_refused(frames, code, "bad_request")
    assert frames[0]["message"] == "binary frames are not supported"


async def test_binary_frame_after_hello_is_refused_and_the_socket_stays(gateway: Gateway) -> None:
    client = await Client.connect(gateway.ws_url, gateway.token("alice", "user"))
    try:
        await client.send_raw(b'{"type": "ping", "id": "p1"}')
        error = await client.wait_for(lambda f: f.get("type") == "error")
        assert (error["code"], error["ref"]) == ("bad_request", None)
        assert (await client.request("ping"))["type"] == "pong"
    finally:
        await client.close()


async def test_bad_token_is_unauthorized(gateway: Gateway) -> None:
    frames, code = await refused_handshake(gateway, hello("not-a-token"))
    assert_refused(frames, code, "unauthorized")
    assert "not-a-token" not in frames[0]["message"]


async def test_expired_token_is_unauthorized(gateway: Gateway) -> None:
    claims = {"sub": "alice", "tenant": "acme", "roles": ["user"], "exp": int(time.time()) - 600}
    token = jwt.encode(claims, TEST_SECRET, algorithm="HS256")
    frames, code = await refused_handshake(gateway, hello(token))
    assert_refused(frames, code, "unauthorized")
    assert "expired" in frames[0]["message"]


async def test_token_signed_with_another_secret_is_unauthorized(gateway: Gateway) -> None:
    other = TokenVerifier("another-secret-" + "y" * 50).issue("alice", "acme", ["user"])
    frames, code = await refused_handshake(gateway, hello(other))
    assert_refused(frames, code, "unauthorized")
    assert TEST_SECRET not in frames[0]["message"]


async def test_unsupported_protocol_closes_4001(gateway: Gateway) -> None:
    frames, code = await refused_handshake(gateway, hello(gateway.token("alice"), protocol=2))
    assert_refused(frames, code, "unsupported_protocol")


async def test_valid_hello_is_welcomed(gateway: Gateway) -> None:
    client = await Client.connect(gateway.ws_url, gateway.token("alice", "user", "reviewer"))
    try:
        assert client.welcome["protocol"] == 1
        assert client.welcome["user"] == "alice"
        assert client.welcome["roles"] == ["reviewer", "user"]
        assert (await client.request("ping"))["type"] == "pong"
    finally:
        await client.close()


# -- Origin --------------------------------------------------------------------------------


async def test_foreign_origin_is_refused_with_403(gateway: Gateway) -> None:
    with pytest.raises(InvalidStatus) as refused:
        await websockets.connect(gateway.ws_url, origin=Origin("http://evil.example"))
    assert refused.value.response.status_code == 403


async def test_own_origin_and_no_origin_are_accepted(gateway: Gateway) -> None:
    own = await Client.connect(
        gateway.ws_url, gateway.token("alice"), origin=f"http://127.0.0.1:{gateway.port}"
    )
    bare = await Client.connect(gateway.ws_url, gateway.token("alice"))
    try:
        assert own.welcome["type"] == "welcome"
        assert bare.welcome["type"] == "welcome"
    finally:
        await own.close()
        await bare.close()


async def test_allowed_origins_are_accepted_others_still_refused(gateway_factory) -> None:
    async with gateway_factory(allowed_origins=["http://app.example"]) as gw:
        client = await Client.connect(gw.ws_url, gw.token("alice"), origin="http://app.example")
        try:
            assert client.welcome["user"] == "alice"
        finally:
            await client.close()
        with pytest.raises(InvalidStatus) as refused:
            await websockets.connect(gw.ws_url, origin=Origin("http://evil.example"))
        assert refused.value.response.status_code == 403


# -- settings validation through the CLI -----------------------------------------------------


def run_cli(tmp_path: Path, **env: str) -> Finished:
    """`python -m gateway serve` run to its end, with no GATEWAY_* variable but `env`'s."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    clean["GATEWAY_DATABASE_URL"] = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    return run_gateway_command(["serve"], env={**clean, **env}, cwd=ROOT, timeout=60)


def test_cli_rejects_a_bad_port(tmp_path: Path) -> None:
    result = run_cli(tmp_path, GATEWAY_PORT="notaport", GATEWAY_SECRET=TEST_SECRET)
    assert result.returncode != 0
    assert "GATEWAY_PORT" in result.stderr
    assert TEST_SECRET not in result.stderr + result.stdout


def test_cli_refuses_public_host_without_secret(tmp_path: Path) -> None:
    result = run_cli(tmp_path, GATEWAY_HOST="0.0.0.0", GATEWAY_PORT="0")
    assert result.returncode != 0
    assert "GATEWAY_SECRET" in result.stderr
    assert "GATEWAY_HOST" in result.stderr
    assert "Uvicorn running" not in result.stderr + result.stdout
