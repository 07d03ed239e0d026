"""Log lines say what they belong to: a run's lines (the SDK's among them) carry its thread, run
and agent, a connection's lines its connection id, as JSON keys (GATEWAY_LOG_FORMAT=json) or
appended to the text line (docs/operations.md "Logs")."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from gateway.auth.access import TokenVerifier
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, GatewayProcess, spawn_gateway
from tests.support.hostile import read_response

REFUND = "refund order 42 for 30 dollars"


async def paused_run(gateway: GatewayProcess) -> dict[str, str]:
    """A refund run up to its pause; the ack of `run.start`."""
    token = TokenVerifier(TEST_SECRET).issue("alice", "acme", ["user"])
    client = await Client.connect(gateway.ws_url, token)
    try:
        ack = await client.request("run.start", input=REFUND)
        await client.wait_event("run.paused")
    finally:
        await client.close()
    return ack


def spawn_logging(tmp_path: Path, log_format: str) -> GatewayProcess:
    return spawn_gateway(
        tmp_path, env={"GATEWAY_LOG_LEVEL": "debug", "GATEWAY_LOG_FORMAT": log_format}
    )


async def test_json_lines_carry_the_run_and_connection_they_belong_to(tmp_path: Path) -> None:
    gateway = spawn_logging(tmp_path, "json")
    try:
        ack = await paused_run(gateway)
    finally:
        gateway.terminate()
    records = [json.loads(line) for line in gateway.log().splitlines() if line]
    assert all({"time", "level", "logger", "message"} <= record.keys() for record in records)

    of_run = [r for r in records if r.get("run_id") == ack["run_id"]]
    # The SDK's own lines inside the run, not only the gateway's.
    assert {r["logger"] for r in of_run} >= {"openai.agents"}
    for record in of_run:
        assert record["thread_id"] == ack["thread_id"]
        assert record["agent"] == "assistant"
        # A run started from a connection is not that connection's work.
        assert "connection_id" not in record

    of_connections = [r for r in records if "connection_id" in r]
    messages = {r["message"] for r in of_connections}
    assert {"connection accepted", "connection closed (1000)"} <= messages
    # One client connected: one connection id, on its lines alone.
    assert len({r["connection_id"] for r in of_connections}) == 1
    assert not any("run_id" in r for r in of_connections)


async def test_text_lines_end_with_the_ids_they_belong_to(tmp_path: Path) -> None:
    gateway = spawn_logging(tmp_path, "text")
    try:
        ack = await paused_run(gateway)
    finally:
        gateway.terminate()
    lines = gateway.log().splitlines()
    suffix = f"[thread_id={ack['thread_id']} run_id={ack['run_id']} agent=assistant]"
    assert any(line.startswith(tuple("0123456789")) and line.endswith(suffix) for line in lines)
    assert any(
        re.search(r"connection accepted \[connection_id=[0-9a-f]{12}\]$", line) for line in lines
    )


async def test_a_connection_is_one_line_and_a_refused_handshake_names_its_peer(
    tmp_path: Path,
) -> None:
    gateway = spawn_gateway(tmp_path)
    try:
        token = TokenVerifier(TEST_SECRET).issue("alice", "acme", ["user"])
        client = await Client.connect(gateway.ws_url, token)
        await client.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(
            b"GET /v1/ws?token=not-for-the-log HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: short\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        refused = await read_response(reader, timeout=10)
        peer = f"127.0.0.1:{writer.get_extra_info('sockname')[1]}"
        writer.close()
    finally:
        gateway.terminate()
    assert refused.status == 400
    lines = gateway.log().splitlines()
    # uvicorn's line says the connection with its peer; websockets' "connection open" is off.
    assert len([line for line in lines if '"WebSocket /v1/ws" [accepted]' in line]) == 1
    assert not any("connection open" in line for line in lines)
    assert any(f'{peer} - "WebSocket /v1/ws" 400 Bad Request' in line for line in lines)
    assert not any("not-for-the-log" in line for line in lines)
