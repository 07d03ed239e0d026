"""Helpers for crash tests: real gateway subprocesses that are SIGKILLed and restarted.

Shared by `tests/crash/test_kill9.py` (one kill at a chosen point) and
`tests/crash/test_soak.py` (many kills at random points of many concurrent runs).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gateway.auth.access import TokenVerifier
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, GatewayProcess

AGENTS_ARGS = ["--agents", "tests.support.agents:registry"]
TIMEOUT = 60.0  # slow CI: 2 cores, a cold subprocess start-up and SQLite fsyncs
TERMINAL = ("run.completed", "run.failed", "run.cancelled")


def token(user: str, *roles: str, tenant: str = "acme") -> str:
    return TokenVerifier(TEST_SECRET).issue(user, tenant, roles or ("user",))


def ws_url(gw: GatewayProcess) -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/ws"


def http(gw: GatewayProcess, user: str, *roles: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{gw.port}",
        headers={"Authorization": f"Bearer {token(user, *roles)}"},
        timeout=30,
    )


def comparable(event: dict[str, Any]) -> tuple[Any, ...]:
    return (event["seq"], event["run_id"], event["event"], event["data"], event["ts"])


def assert_dense(events: list[dict[str, Any]]) -> None:
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(events) + 1)), f"log not dense/ordered: {seqs}"


def charges(effects: Path) -> int:
    """Real executions of `charge` recorded by the `effects` graph (tests/support/agents.py)."""
    if not effects.exists():
        return 0
    lines = effects.read_text().splitlines()
    return sum(1 for line in lines if json.loads(line)["tool"] == "charge")


async def connect(gw: GatewayProcess, opened: list[Client], user: str, *roles: str) -> Client:
    client = await Client.connect(ws_url(gw), token(user, *roles))
    opened.append(client)
    return client


async def close_all(opened: list[Client]) -> None:
    for client in opened:
        try:
            await asyncio.wait_for(client.close(), 5)
        except Exception:  # the server may already be gone
            pass
    opened.clear()


async def crash(gw: GatewayProcess, opened: list[Client]) -> None:
    gw.kill()
    # Let the clients notice the dead socket, then drop them.
    await close_all(opened)


async def subscribe_from_start(gw: GatewayProcess, opened: list[Client], thread_id: str) -> Client:
    watcher = await connect(gw, opened, "watcher", "viewer")
    await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
    return watcher


async def wait_run_end(client: Client, run_id: str) -> dict[str, Any]:
    return await client.wait_for(
        lambda f: f.get("type") == "event" and f["run_id"] == run_id and f["event"] in TERMINAL,
        TIMEOUT,
    )


def describe(gw: GatewayProcess) -> str:
    return f"\n--- gateway log ---\n{gw.log()[-6000:]}"


# -- for clients that outlive a gateway ---------------------------------------------------------


async def request_or_closed(client: Client, type_: str, **fields: Any) -> dict[str, Any]:
    """`client.request`, but fail at once with ConnectionError when the socket dies.

    A plain request to a SIGKILLed gateway waits its whole timeout for an ack that never
    comes; a soak with dozens of kills cannot afford that.
    """
    request = asyncio.ensure_future(client.request(type_, **fields))
    await asyncio.wait({request, client.closed}, return_when=asyncio.FIRST_COMPLETED)
    if request.done():
        return request.result()
    request.cancel()
    try:
        await request
    except BaseException:
        pass
    raise ConnectionError(f"socket closed during {type_} ({client.closed.result()})")


def after_frame(start: int, predicate: Callable[[dict[str, Any]], bool]) -> Callable[..., bool]:
    """A `Client.wait_for` predicate that ignores the first `start` frames of the client.

    `wait_for` shows each frame to the predicate exactly once, in order, so counting calls
    gives each frame's position.
    """
    position = 0

    def match(frame: dict[str, Any]) -> bool:
        nonlocal position
        position += 1
        return position > start and predicate(frame)

    return match


async def read_log(
    gw: GatewayProcess, thread_id: str, *, page: int = 200
) -> tuple[list[dict[str, Any]], int]:
    """A thread's whole log through `GET /v1/threads/{id}/events`, paged; and its head_seq."""
    events: list[dict[str, Any]] = []
    head = 0
    async with http(gw, "auditor", "viewer") as client:
        while True:
            response = await client.get(
                f"/v1/threads/{thread_id}/events",
                params={"after_seq": events[-1]["seq"] if events else 0, "limit": page},
            )
            assert response.status_code == 200, response.text
            body = response.json()
            head = body["head_seq"]
            events.extend(body["events"])
            if len(body["events"]) < page:
                return events, head


def operations(db_path: Path) -> list[dict[str, Any]]:
    """The rows of the operation ledger (`operations` table), read-only through sqlite3."""
    connection = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        connection.row_factory = sqlite3.Row
        rows = connection.execute(
            "SELECT scope, call_id, tool_name, status, result FROM operations"
        ).fetchall()
        return [dict(row) for row in rows]
    finally:
        connection.close()
