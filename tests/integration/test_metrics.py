"""Prometheus metrics scraped from a real gateway during an approval flow (docs/operations.md,
"Metrics")."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.agents.registry import AgentRegistry
from gateway.observability.metrics import MULTIPROC_ENV
from tests.integration.test_workers import dev_token, serving_pids, worker_pids
from tests.support.agents import EffectLog, handoff_graph
from tests.support.client import Client, ProtocolFailure
from tests.support.crash import close_all, crash
from tests.support.crash import connect as crash_connect
from tests.support.gateway import Gateway, GatewayProcess, spawn_gateway
from tests.support.redis import bus_prefix, require_redis

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(gw: Gateway) -> Samples:
    async with gw.http() as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def parse(text: str) -> Samples:
    values: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def connect(gw: Gateway, user: str, *roles: str) -> Client:
    return await Client.connect(gw.ws_url, gw.token(user, *roles))


async def test_approval_flow_moves_the_metrics(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(metrics=True) as gw:
        before = await scrape(gw)
        assert value(before, "gateway_runs_total", state="started", agent="assistant") == 0
        assert value(before, "gateway_approvals_pending") == 0
        alice = await connect(gw, "alice", "user")
        bob = await connect(gw, "bob", "reviewer")
        try:
            await alice.request("run.start", input="refund order 42 for 30 dollars")
            requested = await alice.wait_event("approval.requested")
            await alice.wait_event("run.paused")
            paused = await scrape(gw)
            assert value(paused, "gateway_runs_total", state="started", agent="assistant") == 1
            assert value(paused, "gateway_runs_total", state="paused", agent="assistant") == 1
            assert value(paused, "gateway_approvals_requested_total") == 1
            assert value(paused, "gateway_approvals_pending") == 1
            assert value(paused, "gateway_approval_wait_seconds_count") == 0
            assert value(paused, "gateway_approval_decisions_total", outcome="approve") == 0
            assert value(paused, "gateway_connections") == 2
            assert value(paused, "gateway_subscriptions") == 1
            # The pause stored the run's state.
            assert value(paused, "gateway_checkpoint_bytes_count") >= 1
            assert value(paused, "gateway_checkpoint_bytes_sum") > 0
            assert value(paused, "gateway_checkpoint_write_seconds_count") >= 1
            # The refund waits for its review: not called yet.
            assert value(paused, "gateway_tool_call_seconds_count", tool="issue_refund") == 0

            await bob.request(
                "approval.decide",
                approval_id=requested["data"]["approval_id"],
                decision="approve",
            )
            await alice.wait_event("run.completed")
            done = await scrape(gw)
        finally:
            await alice.close()
            await bob.close()
        closed = await scrape(gw)
    assert value(done, "gateway_approvals_pending") == 0
    assert value(done, "gateway_approval_wait_seconds_count") == 1
    assert value(done, "gateway_approval_wait_seconds_sum") >= 0
    assert value(done, "gateway_approval_decisions_total", outcome="approve") == 1
    assert value(done, "gateway_approval_decisions_total", outcome="reject") == 0
    assert value(done, "gateway_runs_total", state="resumed", agent="assistant") == 1
    assert value(done, "gateway_runs_total", state="completed", agent="assistant") == 1
    assert value(done, "gateway_runs_total", state="failed", agent="assistant") == 0
    assert value(done, "gateway_tool_call_seconds_count", tool="issue_refund") == 1
    assert value(done, "gateway_model_call_seconds_count", agent="assistant") > 0
    # Alice watched the run live: its events reached her socket from their commit.
    assert value(done, "gateway_delivery_lag_seconds_count") > 0
    events = value(done, "gateway_events_appended_total")
    assert events > value(paused, "gateway_events_appended_total") > 0
    # Every stored event went through a timed transaction.
    assert value(done, "gateway_storage_commit_batch_events_sum") == events
    assert value(done, "gateway_storage_commit_seconds_count") >= 1
    assert value(done, "gateway_storage_errors_total") == 0
    assert value(done, "gateway_slow_consumer_closes_total") == 0
    assert value(closed, "gateway_connections") == 0
    assert value(closed, "gateway_subscriptions") == 0


async def test_refusals_are_counted_by_limit(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(metrics=True, max_subscriptions=1) as gw:
        alice = await connect(gw, "alice", "user")
        try:
            t1, t2 = [(await alice.request("thread.create"))["thread_id"] for _ in range(2)]
            await alice.request("thread.subscribe", thread_id=t1)
            with pytest.raises(ProtocolFailure) as refused:
                await alice.request("thread.subscribe", thread_id=t2)
            assert refused.value.code == "rate_limited"
            samples = await scrape(gw)
        finally:
            await alice.close()
    assert value(samples, "gateway_rate_limit_refusals_total", limit="subscriptions") == 1
    assert value(samples, "gateway_rate_limit_refusals_total", limit="frames") == 0
    assert value(samples, "gateway_subscriptions") == 1


async def test_no_metrics_route_unless_enabled(gateway: Gateway) -> None:
    async with gateway.http() as http:
        response = await http.get("/metrics")
    assert response.status_code == 404


def metrics_dir(pid: int) -> str:
    """The PROMETHEUS_MULTIPROC_DIR a worker was given by its supervisor."""
    environ = Path(f"/proc/{pid}/environ").read_text().split("\0")
    return dict(entry.split("=", 1) for entry in environ if "=" in entry)[MULTIPROC_ENV]


async def test_a_scrape_of_any_worker_adds_up_every_worker(
    tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    gateway = spawn_gateway(
        tmp_path,
        env={
            "GATEWAY_BUS_URL": require_redis(),
            "GATEWAY_BUS_PREFIX": bus_prefix(),
            "GATEWAY_METRICS": "true",
            # Development mode: the workers share one signing secret.
            "GATEWAY_SECRET": "",
        },
        args=["--workers", "2"],
    )
    processes.append(gateway)
    pids = worker_pids(gateway)
    assert len(pids) == 2
    directories = {metrics_dir(pid) for pid in pids.values()}
    # One directory for both workers, made for this gateway.
    assert len(directories) == 1
    clients: list[Client] = []
    try:
        # Connect until both workers serve some connection, so runs start on both.
        while serving_pids(gateway.port) != set(pids.values()):
            assert len(clients) < 64, f"every connection went to one worker: {pids}"
            clients.append(
                await Client.connect(gateway.ws_url, await dev_token(gateway.port, "al"))
            )
        for client in clients:
            await client.request("run.start", input="hello")
        for client in clients:
            await client.wait_event("run.completed")
        # Whichever worker answers a scrape, it reports the runs of both.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
            for _ in range(6):
                response = await http.get("/metrics")
                assert response.status_code == 200
                samples = parse(response.text)
                runs = len(clients)
                assert (
                    value(samples, "gateway_runs_total", state="started", agent="assistant") == runs
                )
                assert (
                    value(samples, "gateway_runs_total", state="completed", agent="assistant")
                    == runs
                )
                assert value(samples, "gateway_model_call_seconds_count", agent="assistant") >= runs
                assert value(samples, "gateway_connections") == len(clients)
                # Each worker told the other of its threads' growth over Redis.
                assert value(samples, "gateway_bus_messages_sent_total") > 0
                assert value(samples, "gateway_bus_messages_received_total") > 0
                assert value(samples, "gateway_bus_outages_total") == 0
    finally:
        for client in clients:
            await client.close()
    gateway.terminate()
    # The supervisor removed the workers' metrics files as it exited.
    assert not any(map(os.path.exists, directories))


async def test_a_run_taken_over_at_start_up_is_counted(
    tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    env = {"GATEWAY_METRICS": "true", "GATEWAY_DEMO_DELAY_MS": "30"}
    first = spawn_gateway(tmp_path, env=env)
    processes.append(first)
    opened: list[Client] = []
    alice = await crash_connect(first, opened, "alice", "user")
    ack = await alice.request("run.start", input="tell me a story")
    await alice.wait_event("message.delta")
    await crash(first, opened)
    # The same instance id and database: the new process recovers the run at start-up.
    second = spawn_gateway(tmp_path, env=env)
    processes.append(second)
    watcher = await crash_connect(second, opened, "alice", "user")
    try:
        await watcher.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
        await watcher.wait_event("run.completed", timeout=30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{second.port}") as client:
            response = await client.get("/metrics")
    finally:
        await close_all(opened)
    samples = parse(response.text)
    assert value(samples, "gateway_run_takeovers_total", kind="startup") == 1
    assert value(samples, "gateway_run_takeovers_total", kind="lease_expired") == 0
    assert value(samples, "gateway_runs_total", state="recovered", agent="assistant") == 1
    assert value(samples, "gateway_runs_total", state="completed", agent="assistant") == 1
    # Counts are the process's own: the first process's start is not among them.
    assert value(samples, "gateway_runs_total", state="started", agent="assistant") == 0


async def test_metrics_on_a_port_of_their_own(
    tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    """GATEWAY_METRICS_PORT: the scrape is answered there, and the clients' port has no
    /metrics; the listener stops with the gateway."""
    gateway = spawn_gateway(tmp_path, env={"GATEWAY_METRICS": "true", "GATEWAY_METRICS_PORT": "0"})
    processes.append(gateway)
    [port] = re.findall(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", gateway.log())
    async with httpx.AsyncClient(timeout=10) as http:
        elsewhere = await http.get(f"http://127.0.0.1:{gateway.port}/metrics")
        scraped = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert elsewhere.status_code == 404
    assert scraped.status_code == 200
    names = {family.name for family in text_string_to_metric_families(scraped.text)}
    assert {"gateway_runs", "gateway_connections", "gateway_approvals_pending"} <= names
    gateway.terminate()
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(timeout=5) as http:
            await http.get(f"http://127.0.0.1:{port}/metrics")


def test_a_metrics_port_with_several_workers_is_refused() -> None:
    from gateway.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="GATEWAY_METRICS_PORT cannot be used with"):
        load_settings(metrics=True, metrics_port=9100, workers=2)
    assert load_settings(metrics=True, metrics_port=9100).metrics_port == 9100


async def test_model_calls_of_an_agent_handed_off_to_are_counted_under_its_name(
    gateway_factory: Callable[..., Any],
) -> None:
    graph, _, _ = handoff_graph(EffectLog())
    async with gateway_factory(metrics=True, registry=AgentRegistry([graph])) as gw:
        alice = await connect(gw, "alice", "user")
        await alice.request("run.start", input="I want a refund")
        await alice.wait_event("run.paused")
        samples = await scrape(gw)
        calls = {
            dict(labels).get("agent"): count
            for (name, labels), count in samples.items()
            if name == "gateway_model_call_seconds_count"
        }
        assert calls.get("triage") == 1 and calls.get("refunds") == 1, calls
        assert "other" not in calls
        await alice.close()
