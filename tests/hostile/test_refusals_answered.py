"""Refusals answered and logged as docs/protocol.md says: a WebSocket frame over the size limit
closes with 1009 and one INFO line (whether the WebSocket layer or the connection refuses it),
and a POST to a path no route has is 404, not the demo's 405."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest
import websockets

from gateway.auth.access import TokenVerifier
from tests.support.gateway import TEST_SECRET, GatewayProcess
from tests.support.hostile import eventually

TOKENS = TokenVerifier(TEST_SECRET)
LAYER_LINE = "closing a WebSocket whose client sent a frame over the size limit (1009)"
CONNECTION_LINE = "closing a connection that sent a frame over the size limit (1009)"


async def closed_by(url: str, frames: list[str]) -> int:
    async with websockets.connect(url, max_size=None) as ws:
        for frame in frames:
            await ws.send(frame)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None, closed.value
    return closed.value.rcvd.code


@pytest.mark.parametrize(
    ("size", "line"), [(70_000, CONNECTION_LINE), (200_000, LAYER_LINE)], ids=["app", "layer"]
)
async def test_an_oversized_frame_is_closed_and_logged(
    spawn: Callable[..., GatewayProcess], size: int, line: str
) -> None:
    # The WebSocket layer reads frames up to 128 KiB (the frontend limit); /v1/ws takes 64 KiB.
    gateway = spawn(env={"GATEWAY_FRONTEND_BODY_BYTES": str(128 * 1024)})
    hello = json.dumps({"type": "hello", "protocol": 1, "token": TOKENS.issue("a", "acme", [])})
    code = await closed_by(gateway.ws_url, [hello, "x" * size])
    assert code == 1009
    assert await eventually(lambda: line in gateway.log(), 5), gateway.log()
    assert "ERROR" not in gateway.log() and "Traceback" not in gateway.log()


async def test_a_hello_and_an_oversized_frame_in_one_write_close_quietly(
    spawn: Callable[..., GatewayProcess],
) -> None:
    """Both frames in one TCP segment: the layer closes on the second before the connection
    has answered the first, and the welcome it then sends meets a closed socket, which is
    a client gone (no ERROR, no traceback), not a fault of the gateway's."""
    gateway = spawn(env={"GATEWAY_FRONTEND_BODY_BYTES": str(128 * 1024)})
    hello = json.dumps({"type": "hello", "protocol": 1, "token": TOKENS.issue("a", "acme", [])})
    async with websockets.connect(gateway.ws_url, max_size=None, compression=None) as ws:
        ws.protocol.send_text(hello.encode())
        ws.protocol.send_text(b"x" * 200_000)
        ws.transport.write(b"".join(ws.protocol.data_to_send()))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert await eventually(lambda: LAYER_LINE in gateway.log(), 5), gateway.log()
    await asyncio.sleep(0.5)  # the connection's handler has answered the hello by now
    assert "ERROR" not in gateway.log() and "Traceback" not in gateway.log(), gateway.log()


async def test_a_post_to_no_route_is_404(spawn: Callable[..., GatewayProcess]) -> None:
    gateway = spawn()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
        for path in ("/no/such/path", "/v1/no-such-endpoint", "/"):
            answer = await http.post(path, json={})
            assert answer.status_code == 404, (path, answer.status_code, answer.text)
        # The demo still serves its pages.
        assert (await http.get("/")).status_code == 200
