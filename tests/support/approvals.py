"""Approval tests' common moves: a requester and a reviewer connected to a gateway, and
decisions over the WebSocket or the HTTP reviewer API that the gateway must refuse."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest

from gateway.agents.registry import AgentRegistry
from tests.support.client import Client, ProtocolFailure, clients
from tests.support.gateway import Gateway


@contextlib.asynccontextmanager
async def requester_and_reviewer(
    gateway_factory: Callable[..., AbstractAsyncContextManager[Gateway]],
    registry: AgentRegistry,
    **settings: Any,
) -> AsyncIterator[tuple[Gateway, Client, Client]]:
    """A gateway serving `registry`, with alice (`user`) and bob (`reviewer`) connected."""
    async with gateway_factory(registry, **settings) as gw, clients(gw) as open_client:
        yield gw, await open_client("alice", "user"), await open_client("bob", "reviewer")


async def refused(client: Client, approval_id: str, decision: str = "approve") -> ProtocolFailure:
    """The error frame a decision over the WebSocket gets; the test fails if it is accepted."""
    with pytest.raises(ProtocolFailure) as failure:
        await client.request("approval.decide", approval_id=approval_id, decision=decision)
    return failure.value


async def http_decide(
    gw: Gateway, token: str, approval_id: str, decision: str = "approve"
) -> httpx.Response:
    async with gw.http() as http:
        return await http.post(
            f"/v1/approvals/{approval_id}/decision",
            json={"decision": decision},
            headers={"Authorization": f"Bearer {token}"},
        )
