from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from gateway.agents.registry import AgentRegistry
from tests.support.client import Client
from tests.support.gateway import Gateway, GatewayProcess, running_gateway, test_settings


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """The test's SQLite file (the database of `database_url` on the SQLite backend)."""
    return tmp_path / "gateway.db"


@pytest.fixture
def gateway_factory(
    database_url: str,
) -> Callable[..., AbstractAsyncContextManager[Gateway]]:
    """`async with gateway_factory(registry=..., **settings) as gw:` on the test's database."""

    def make(
        registry: AgentRegistry | None = None,
        *,
        socket_sndbuf: int | None = None,
        tracer_provider: Any = None,
        **overrides: Any,
    ) -> Any:
        return running_gateway(
            test_settings(database_url, **overrides),
            registry,
            socket_sndbuf=socket_sndbuf,
            tracer_provider=tracer_provider,
        )

    return make


@pytest.fixture
async def gateway(gateway_factory: Callable[..., Any]) -> AsyncIterator[Gateway]:
    async with gateway_factory() as gw:
        yield gw


@pytest.fixture
def connect(gateway: Gateway) -> Callable[..., Any]:
    clients: list[Client] = []

    async def open_client(user: str = "alice", *roles: str, tenant: str = "acme") -> Client:
        client = await Client.connect(gateway.ws_url, gateway.token(user, *roles, tenant=tenant))
        clients.append(client)
        return client

    return open_client


@pytest.fixture
def processes() -> Iterator[list[GatewayProcess]]:
    """Gateway subprocesses a test spawned (append them): killed when the test ends. Their
    logs' ends are printed then: pytest shows them with a failure, and only then."""
    started: list[GatewayProcess] = []
    yield started
    for process in started:
        process.kill()
        lines = process.log().splitlines()
        print(f"--- {process.log_path.name} (last {min(len(lines), 200)} lines) ---")
        print("\n".join(lines[-200:]))
