"""A second copy of the gateway started by mistake never touches the first one's live runs.

Two real `python -m gateway serve` processes on one database: the second, with the same settings
(so the same port and the same default instance id `<host>:<port>`), stops at the port before
its start-up begins; with the same instance id on another port, it is refused by the instance
claim (persistence/instances.py). Either way the first copy's streaming run goes on untouched:
no `message.aborted`, no `run.recovered`, one model call; and the second copy exits with one
clear line and never says "gateway ready".
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.support.client import Client
from tests.support.fake_openai import running_fake_openai
from tests.support.fork_server import GatewayCommand, gateway_command
from tests.support.gateway import ROOT, TEST_SECRET, GatewayProcess, spawn_gateway

pytestmark = pytest.mark.both_backends

# Long enough to stream for several seconds at the fake's pace, one word per delta.
STORY = "tell me a story " + " ".join(f"word{n}" for n in range(60))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def base_env(database_url: str, model_port: int) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("GATEWAY_", "OPENAI_"))
    }
    return {
        **env,
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_SECRET": TEST_SECRET,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
        "GATEWAY_LEASE_TTL_S": "2",
        "PYTHONPATH": str(ROOT),
    }


def second_copy(env: dict[str, str], port: int, log_path: Path) -> tuple[int, str]:
    """Run `python -m gateway serve --port <port>` to its end: (exit status, its output)."""
    process = gateway_command(GatewayCommand(["serve", "--port", str(port)], env, ROOT, log_path))
    status = process.wait(60)
    return status, log_path.read_text()


async def first_copy_untouched(first: GatewayProcess, client: Client, ack: dict, fake) -> None:
    await client.wait_event("run.completed", timeout=60)
    names = [e["event"] for e in client.events_of(ack["thread_id"])]
    assert "run.recovered" not in names and "message.aborted" not in names, names
    assert names.count("message.started") == 1 and names.count("run.completed") == 1
    assert len(fake.response_requests) == 1, "the model was called again"
    token = first_token()
    async with httpx.AsyncClient() as http:
        stored = await http.get(
            f"http://127.0.0.1:{first.port}/v1/threads/{ack['thread_id']}/events?limit=1000",
            headers={"Authorization": f"Bearer {token}"},
        )
    assert [e["event"] for e in stored.json()["events"]] == names


def first_token() -> str:
    from gateway.auth.access import TokenVerifier

    return TokenVerifier(TEST_SECRET).issue("alice", "acme", ["user"])


async def start_story(first: GatewayProcess) -> tuple[Client, dict]:
    client = await Client.connect(first.ws_url, first_token())
    ack = await client.request("run.start", input=STORY)
    await client.wait_event("message.delta")
    return client, ack


async def test_a_second_copy_with_the_same_settings_stops_at_the_port(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    async with running_fake_openai(delta_delay_s=0.1) as (fake, model_port):
        env = base_env(database_url, model_port)
        port = free_port()
        # The same settings: no GATEWAY_INSTANCE_ID, so both are `<host>:<port>`.
        first = spawn_gateway(tmp_path, env=env, args=["--port", str(port)])
        processes.append(first)
        client, ack = await start_story(first)

        status, output = second_copy(env, port, tmp_path / "second.log")
        assert status != 0
        assert f"not starting: cannot listen on 127.0.0.1 port {port}" in output, output
        assert "GATEWAY_PORT" in output
        assert "gateway ready" not in output and "Traceback" not in output
        assert first.process.poll() is None
        await first_copy_untouched(first, client, ack, fake)
        await client.close()


async def test_a_second_process_under_a_live_instance_id_is_refused(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    async with running_fake_openai(delta_delay_s=0.1) as (fake, model_port):
        env = {**base_env(database_url, model_port), "GATEWAY_INSTANCE_ID": "gw-twin"}
        first = spawn_gateway(tmp_path, env=env)
        processes.append(first)
        client, ack = await start_story(first)

        started = time.monotonic()
        status, output = second_copy(env, free_port(), tmp_path / "second.log")
        assert status != 0
        refusals = [line for line in output.splitlines() if "not starting" in line]
        assert len(refusals) == 1, output
        assert "'gw-twin'" in refusals[0] and "GATEWAY_INSTANCE_ID" in refusals[0]
        assert "gateway ready" not in output and "Traceback" not in output, output
        assert "Application startup failed" not in output
        # Refused after watching the claim for a few seconds at most, not a lease's lifetime.
        assert time.monotonic() - started < 20
        await first_copy_untouched(first, client, ack, fake)
        await client.close()


async def test_a_restart_under_the_id_of_a_killed_process_takes_its_runs_over(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    async with running_fake_openai(delta_delay_s=0.1) as (_fake, model_port):
        env = {
            **base_env(database_url, model_port),
            "GATEWAY_INSTANCE_ID": "gw-restarted",
            # Long: taken over at once by the id's next process, not after the lease expired.
            "GATEWAY_LEASE_TTL_S": "120",
        }
        first = spawn_gateway(tmp_path, env=env)
        processes.append(first)
        client, ack = await start_story(first)
        first.kill()
        await client.close()

        again = spawn_gateway(tmp_path, env=env)
        processes.append(again)
        watcher = await Client.connect(again.ws_url, first_token())
        await watcher.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
        await watcher.wait_event("run.completed", timeout=60)
        names = [e["event"] for e in watcher.events_of(ack["thread_id"])]
        assert names.count("run.recovered") == 1
        assert "previous process stopped without a graceful shutdown" in again.log()
        await watcher.close()
