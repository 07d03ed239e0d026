"""The gateway as a library: mounted under a path prefix of another Starlette application
(docs/examples/mounted_gateway.py, run as written), without its demo UI, and behind a reverse
proxy whose forwarded client address is believed only from the configured peers."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import uvicorn

from gateway.server.config import gateway_config
from tests.support.client import Client, ProtocolFailure
from tests.support.gateway import ROOT, Gateway
from tests.support.gateway import test_settings as settings_for

EXAMPLE = ROOT / "docs" / "examples" / "mounted_gateway.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mounted_gateway", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_mounted_example_serves_the_host_and_the_gateway(tmp_path: Path) -> None:
    example = load_example()
    settings = settings_for(tmp_path / "gateway.db", demo_ui=False)
    app = example.build(settings)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(gateway_config(app, settings, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        while not server.started:
            assert not task.done(), "the host application did not start"
            await asyncio.sleep(0.01)
        port = listener.getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/")).json()["chat"] == "/chat/v1/ws"
            assert (await http.get("/chat/readyz")).status_code == 200
            assert (await http.get("/chat/v1/openapi.json")).status_code == 200
            # The API only: no demo page under the prefix.
            assert (await http.get("/chat/")).status_code == 404
        gw = Gateway(port=port, settings=settings)
        client = await Client.connect(
            f"ws://127.0.0.1:{port}/chat/v1/ws", gw.token("alice", "user")
        )
        try:
            started = await client.request("run.start", input="tell me a story")
            done = await client.wait_event("run.completed")
            assert done["run_id"] == started["run_id"]
        finally:
            await client.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def test_without_the_demo_ui_only_the_api_is_served(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory() as gw, gw.http() as http:
        assert (await http.get("/")).status_code == 200
        assert (await http.get("/js/gateway-client/index.js")).status_code == 200
    async with gateway_factory(demo_ui=False) as gw, gw.http() as http:
        assert (await http.get("/")).status_code == 404
        assert (await http.get("/js/gateway-client/index.js")).status_code == 404
        assert (await http.get("/v1/openapi.json")).status_code == 200


async def rejected_source(gw: Gateway, db_path: Path, forwarded_for: str) -> str:
    """Connect with a bad token through a 'proxy' header; the source the audit recorded."""
    with pytest.raises(ProtocolFailure):
        await Client.connect(
            gw.ws_url, "not-a-jwt", additional_headers={"X-Forwarded-For": forwarded_for}
        )
    for _ in range(100):
        with sqlite3.connect(db_path) as db:
            rows = db.execute(
                "SELECT source FROM audit WHERE action = 'auth.token_rejected'"
            ).fetchall()
        if rows:
            return str(rows[-1][0])
        await asyncio.sleep(0.05)
    raise AssertionError("no refusal recorded")


async def test_forwarded_addresses_are_believed_only_from_the_configured_proxies(
    gateway_factory: Callable[..., Any], db_path: Path
) -> None:
    # The default believes a proxy on this machine: the address it forwards is recorded.
    async with gateway_factory() as gw:
        assert await rejected_source(gw, db_path, "203.0.113.7") == "203.0.113.7"
    await asyncio.to_thread(db_path.unlink)
    # Another proxy address configured: the loopback peer's header is not believed.
    async with gateway_factory(forwarded_allow_ips="10.0.0.0/8") as gw:
        assert await rejected_source(gw, db_path, "203.0.113.7") == "127.0.0.1"


def test_forwarded_allow_ips_must_be_addresses_or_networks(tmp_path: Path) -> None:
    from gateway.settings import SettingsError

    assert settings_for(tmp_path / "g.db", forwarded_allow_ips=" 10.0.0.1, 192.168.0.0/16 ,*")
    with pytest.raises(SettingsError, match="GATEWAY_FORWARDED_ALLOW_IPS"):
        settings_for(tmp_path / "g.db", forwarded_allow_ips="proxy.internal")
