"""Tokens that cannot be tokens (empty, or longer than 8 KiB) get one rule over both transports:
HTTP answers 401 `unauthorized`, the WebSocket an `unauthorized` error and close 4001, on the
first hello and on a later one alike."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
import websockets

from gateway.auth.access import TokenVerifier
from gateway.protocol.close_codes import CloseCode
from tests.support.gateway import TEST_SECRET, GatewayProcess

TOKENS = TokenVerifier(TEST_SECRET)
NOT_TOKENS = {"empty": "", "oversized": "x" * (8 * 1024 + 1)}


async def refused_hello(url: str, frames: list[dict[str, object]]) -> tuple[dict, int]:
    """The error frame answering the last of `frames`, and the close code after it."""
    async with websockets.connect(url, max_size=None) as ws:
        for frame in frames:
            await ws.send(json.dumps(frame))
        while True:
            reply = json.loads(await ws.recv())
            if reply["type"] == "error":
                break
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None
    return reply, closed.value.rcvd.code


@pytest.mark.parametrize("kind", sorted(NOT_TOKENS))
async def test_a_token_that_cannot_be_one_is_unauthorized_everywhere(
    spawn: Callable[..., GatewayProcess], kind: str
) -> None:
    gateway = spawn()
    token = NOT_TOKENS[kind]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
        header = f"Bearer {token}".strip()
        answer = await http.get("/v1/threads", headers={"Authorization": header})
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "unauthorized"

    first, code = await refused_hello(
        gateway.ws_url, [{"type": "hello", "id": "h1", "protocol": 1, "token": token}]
    )
    assert (first["code"], first["ref"], code) == ("unauthorized", "h1", CloseCode.UNAUTHORIZED)

    good = TOKENS.issue("alice", "acme", ["user"])
    later, code = await refused_hello(
        gateway.ws_url,
        [
            {"type": "hello", "protocol": 1, "token": good},
            {"type": "hello", "id": "h2", "protocol": 1, "token": token},
        ],
    )
    assert (later["code"], later["ref"], code) == ("unauthorized", "h2", CloseCode.UNAUTHORIZED)
