"""Identity-provider tokens over a real server: RS256/ES256 from a JWKS file or URL, what
development mode means then, issuer/audience on development tokens, and a JWKS outage
answered as retryable (`unavailable`) rather than as a refusal."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import websockets

from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, Gateway
from tests.support.jwks import (
    claims,
    closed_port_url,
    ec_key,
    jwks,
    rsa_key,
    serve_jwks,
    write_jwks,
)

CLOSE_UNAUTHORIZED = 4001
CLOSE_TRY_AGAIN = 1013


async def hello_refused(gw: Gateway, token: str) -> tuple[dict[str, Any], int | None]:
    async with websockets.connect(gw.ws_url) as ws:
        await ws.send(json.dumps({"type": "hello", "protocol": 1, "token": token}))
        frame = json.loads(await ws.recv())
        try:
            await ws.recv()
        except websockets.ConnectionClosed:
            pass
        rcvd = ws.protocol.close_rcvd
        return frame, rcvd.code if rcvd else None


async def get_threads(gw: Gateway, token: str) -> tuple[int, dict[str, Any]]:
    async with gw.http() as http:
        response = await http.get("/v1/threads", headers={"Authorization": f"Bearer {token}"})
    return response.status_code, response.json()


async def test_jwks_file_without_secret(
    gateway_factory: Callable[..., Any], tmp_path: Path
) -> None:
    rsa = rsa_key("rsa-1")
    path = write_jwks(tmp_path / "jwks.json", jwks(rsa))
    async with gateway_factory(secret=None, jwks_file=str(path)) as gw:
        client = await Client.connect(gw.ws_url, rsa.sign(claims(sub="rita")))
        try:
            assert client.welcome["user"] == "rita"
            assert (await client.request("thread.create"))["thread_id"]
        finally:
            await client.close()
        assert (await get_threads(gw, rsa.sign(claims())))[0] == 200
        # No secret: HS256 tokens are refused, and no development tokens are offered.
        frame, code = await hello_refused(gw, gw.token("alice"))
        assert (frame["code"], code) == ("unauthorized", CLOSE_UNAUTHORIZED)
        async with gw.http() as http:
            assert (await http.post("/v1/dev/token", json={"user": "x"})).status_code == 404


async def test_jwks_url_and_its_outage(gateway_factory: Callable[..., Any]) -> None:
    ec = ec_key("ec-1")
    with serve_jwks(jwks(ec)) as server:
        async with gateway_factory(jwks_url=server.url, jwks_refetch_s=0) as gw:
            client = await Client.connect(gw.ws_url, ec.sign(claims(sub="eve")))
            try:
                assert client.welcome["user"] == "eve"
            finally:
                await client.close()
            # The shared secret keeps working beside the provider's keys.
            hs = await Client.connect(gw.ws_url, gw.token("alice"))
            await hs.close()
            server.status = 503
            # A key nobody has cached while the provider is down: retry later, not a refusal.
            stranger = rsa_key("rsa-new").sign(claims())
            frame, code = await hello_refused(gw, stranger)
            assert (frame["type"], frame["code"], code) == ("error", "unavailable", CLOSE_TRY_AGAIN)
            status, body = await get_threads(gw, stranger)
            assert (status, body["error"]["code"]) == (503, "unavailable")
            # The cached key still answers during the outage.
            assert (await get_threads(gw, ec.sign(claims())))[0] == 200
    async with gateway_factory(jwks_url=closed_port_url()) as gw:
        frame, code = await hello_refused(gw, ec.sign(claims()))
        assert (frame["code"], code) == ("unavailable", CLOSE_TRY_AGAIN)


async def test_dev_tokens_carry_the_configured_issuer_and_audience(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(
        secret=None, jwt_issuer="https://idp.example", jwt_audience="agents-gateway"
    ) as gw:
        async with gw.http() as http:
            response = await http.post("/v1/dev/token", json={"user": "alice", "tenant": "acme"})
        assert response.status_code == 200
        token = response.json()["token"]
        client = await Client.connect(gw.ws_url, token)
        try:
            assert client.welcome["user"] == "alice"
        finally:
            await client.close()


async def test_issuer_and_audience_are_enforced_on_the_websocket(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(jwt_issuer="https://idp.example", jwt_audience="gw") as gw:
        with_both = jwt.encode(
            claims(iss="https://idp.example", aud="gw"), TEST_SECRET, algorithm="HS256"
        )
        client = await Client.connect(gw.ws_url, with_both)
        await client.close()
        for token, fragment in [
            (gw.token("alice"), "'iss'"),
            (jwt.encode(claims(iss="https://idp.example"), TEST_SECRET), "'aud'"),
            (jwt.encode(claims(iss="https://x.example", aud="gw"), TEST_SECRET), "issuer"),
        ]:
            frame, code = await hello_refused(gw, token)
            assert (frame["code"], code) == ("unauthorized", CLOSE_UNAUTHORIZED)
            assert fragment in frame["message"]
