"""Request bodies from hostile clients: huge, streamed without end, of the wrong media type,
or abandoned half way. Each is refused with its code before it costs the server memory, and
none of them makes the server log an error."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from gateway.auth.access import TokenVerifier
from tests.support.gateway import TEST_SECRET, GatewayProcess
from tests.support.hostile import (
    MiB,
    eventually,
    memory_kib,
    post_stream,
    reset_peak_memory,
    shared_gateway,
)

# Each of the four attackers offers this much; the server may keep at most `ALLOWED_GROWTH`
# of all of it (the body limit is 64 KiB; the rest is buffers and allocator slack).
BODY_BYTES = 48 * MiB
ALLOWED_GROWTH_KIB = 8 * 1024


@pytest.fixture(scope="module")
def dev_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Development mode: `POST /v1/dev/token` answers anyone, without a token."""
    with shared_gateway(tmp_path_factory, "dev", env={"GATEWAY_SECRET": ""}) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with shared_gateway(tmp_path_factory, "secret") as gateway:
        yield gateway


def bearer() -> dict[str, str]:
    token = TokenVerifier(TEST_SECRET).issue("mallory", "acme", ["reviewer"])
    return {"Authorization": f"Bearer {token}"}


async def warm_up(gateway: GatewayProcess, path: str, headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
        for _ in range(3):
            await http.post(path, json={"decision": "approve", "user": "u"}, headers=headers)


@pytest.mark.parametrize(
    ("dev_mode", "path"),
    [(False, "/v1/approvals/ap_missing/decision"), (True, "/v1/dev/token")],
    ids=["decision-with-token", "dev-token-without-token"],
)
async def test_huge_bodies_cost_no_memory(
    request: pytest.FixtureRequest, dev_mode: bool, path: str
) -> None:
    gateway: GatewayProcess = request.getfixturevalue("dev_gateway" if dev_mode else "gateway")
    headers = {} if dev_mode else bearer()
    await warm_up(gateway, path, headers)
    pid = gateway.process.pid
    before = memory_kib(pid)
    peak_reset = reset_peak_memory(pid)
    # Two declare their size, two stream chunks with no size announced.
    responses = await asyncio.gather(
        *(
            post_stream(gateway.port, path, BODY_BYTES, headers=headers, chunked=chunked)
            for chunked in (False, True, False, True)
        )
    )
    after = memory_kib(pid)
    assert [r.status for r in responses] == [413] * 4, [r.head for r in responses]
    assert all(b'"too_large"' in r.body for r in responses)
    baseline = before["VmRSS"] if peak_reset else before["VmHWM"]
    growth = after["VmHWM"] - baseline
    print(f"peak growth {growth} KiB for 4 x {BODY_BYTES // MiB} MiB offered")
    assert growth <= ALLOWED_GROWTH_KIB, (before, after)


async def test_json_endpoints_need_a_json_media_type(dev_gateway: GatewayProcess) -> None:
    gateway = dev_gateway
    body = b'{"user": "u"}'
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
        for content_type in (None, "text/plain", "application/x-www-form-urlencoded", "a/json"):
            headers = {} if content_type is None else {"Content-Type": content_type}
            refused = await http.post("/v1/dev/token", content=body, headers=headers)
            assert refused.status_code == 415, (content_type, refused.text)
            assert refused.json()["error"]["code"] == "unsupported_media_type"
        for content_type in ("application/json; charset=utf-8", "application/merge+json"):
            accepted = await http.post(
                "/v1/dev/token", content=body, headers={"Content-Type": content_type}
            )
            assert accepted.status_code == 200, (content_type, accepted.text)


async def test_a_client_leaving_mid_body_is_one_info_line(gateway: GatewayProcess) -> None:
    for _ in range(3):
        _, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        token = bearer()["Authorization"]
        writer.write(
            (
                "POST /v1/approvals/ap_x/decision HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: {token}\r\nContent-Type: application/json\r\n"
                'Content-Length: 1000\r\n\r\n{"decision"'
            ).encode()
        )
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
    noted = await eventually(lambda: gateway.log().count("left before sending its body") == 3, 10)
    log = gateway.log()
    assert "Traceback" not in log and " ERROR " not in log, log
    assert noted, log
