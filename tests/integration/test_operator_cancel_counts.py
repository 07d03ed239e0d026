"""Cancels from the operator's command line in `gateway_runs_total{state="cancelled"}`
(docs/operations.md "Metrics"): the command counts nothing itself; one gateway process counts
each such cancel, at its next lease scan or, if none ran at the time, at its start-up, however
many processes share the database."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from gateway.auth.access import TokenVerifier
from persistence.backends import open_store
from persistence.uncounted_cancels import UncountedCancels
from tests.integration.test_metrics import parse
from tests.integration.test_operator_cli import cli, paused_refund
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, GatewayProcess, spawn_gateway
from tests.support.redis import bus_prefix, require_redis

pytestmark = pytest.mark.both_backends

# Each process looks for uncounted cancels at this interval (its lease scan).
SCAN_S = 0.3
# Several scans of every process: long enough for a second count to show, were there one.
SETTLE_S = 2.0


def gateway_env(database_url: str, instance_id: str) -> dict[str, str]:
    return {
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_METRICS": "true",
        "GATEWAY_LEASE_SCAN_S": str(SCAN_S),
        "GATEWAY_INSTANCE_ID": instance_id,
    }


async def cancelled(gateway: GatewayProcess) -> dict[str, float]:
    """The gateway's `gateway_runs_total{state="cancelled"}`, by agent."""
    async with httpx.AsyncClient() as http:
        response = await http.get(f"http://127.0.0.1:{gateway.port}/metrics")
    assert response.status_code == 200
    return {
        dict(labels)["agent"]: count
        for (name, labels), count in parse(response.text).items()
        if name == "gateway_runs_total" and dict(labels)["state"] == "cancelled"
    }


async def total(gateways: list[GatewayProcess]) -> float:
    return sum([sum((await cancelled(g)).values()) for g in gateways])


async def counted_within(gateways: list[GatewayProcess], expected: float, within_s: float) -> None:
    """Waits until the gateways' cancels add up to `expected`, then stay there for a while."""
    deadline = time.monotonic() + within_s
    while await total(gateways) < expected:
        assert time.monotonic() < deadline, "the operator's cancel was not counted in time"
        await asyncio.sleep(0.1)
    await asyncio.sleep(SETTLE_S)
    assert await total(gateways) == expected


async def waiting(database_url: str) -> int:
    store = open_store(database_url)
    try:
        return await UncountedCancels(store).waiting()
    finally:
        await store.close()


async def alice_on(gateway: GatewayProcess) -> Client:
    return await Client.connect(
        gateway.ws_url, TokenVerifier(TEST_SECRET).issue("alice", "acme", ["user"])
    )


async def test_a_cancel_from_the_command_line_is_counted_once_by_the_gateway(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    gateway = spawn_gateway(tmp_path, env=gateway_env(database_url, "gw-count"))
    processes.append(gateway)
    alice = await alice_on(gateway)
    try:
        run = await paused_refund(alice)
        assert await cancelled(gateway) == {}
        done = await cli(database_url, "runs", "cancel", run["run_id"])
        assert done.status == 0, done.err
        await counted_within([gateway], 1, within_s=10)
        shown = (await cli(database_url, "runs", "show", run["run_id"], "--json")).json()
        assert await cancelled(gateway) == {shown["agent"]: 1}
        assert await waiting(database_url) == 0

        # A cancel the gateway makes itself is counted as it stores it, and only then.
        second = await paused_refund(alice)
        await alice.request("run.cancel", run_id=second["run_id"])
        await counted_within([gateway], 2, within_s=5)
    finally:
        await alice.close()


async def test_a_cancel_made_while_no_gateway_runs_is_counted_by_the_next_one(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    env = gateway_env(database_url, "gw-count")
    # No lease scan before the counts are read: only the start-up claim can count it.
    env["GATEWAY_LEASE_SCAN_S"] = "3600"
    first = spawn_gateway(tmp_path, env=env)
    processes.append(first)
    alice = await alice_on(first)
    try:
        run = await paused_refund(alice)
    finally:
        await alice.close()
    first.terminate()
    done = await cli(database_url, "runs", "cancel", run["run_id"])
    assert done.status == 0, done.err
    assert await waiting(database_url) == 1

    second = spawn_gateway(tmp_path, env=env)
    processes.append(second)
    await counted_within([second], 1, within_s=10)
    assert await waiting(database_url) == 0


async def test_with_two_processes_on_one_database_only_one_counts_it(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    bus = {"GATEWAY_BUS_URL": require_redis(), "GATEWAY_BUS_PREFIX": bus_prefix()}
    for name in ("gw-a", "gw-b"):
        processes.append(spawn_gateway(tmp_path, env={**gateway_env(database_url, name), **bus}))
    a, b = processes
    alice = await alice_on(a)
    try:
        runs = [await paused_refund(alice) for _ in range(3)]
    finally:
        await alice.close()
    for run in runs:
        done = await cli(database_url, "runs", "cancel", run["run_id"], env=bus)
        assert done.status == 0, done.err
    # Each cancel is counted by one of the two: the sum over both scrapes is one per cancel.
    await counted_within([a, b], len(runs), within_s=10)
    assert await waiting(database_url) == 0
