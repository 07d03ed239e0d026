"""Prometheus metrics scraped from a real gateway during an approval flow (docs/operations.md,
"Metrics")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.client import Client
from tests.support.gateway import Gateway


async def scrape(gw: Gateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with gw.http() as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.text):
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
        assert value(before, "gateway_runs_total", state="started") == 0
        alice = await connect(gw, "alice", "user")
        bob = await connect(gw, "bob", "reviewer")
        try:
            await alice.request("run.start", input="refund order 42 for 30 dollars")
            requested = await alice.wait_event("approval.requested")
            await alice.wait_event("run.paused")
            paused = await scrape(gw)
            assert value(paused, "gateway_runs_total", state="started") == 1
            assert value(paused, "gateway_runs_total", state="paused") == 1
            assert value(paused, "gateway_approvals_requested_total") == 1
            assert value(paused, "gateway_approval_decisions_total", outcome="approve") == 0
            assert value(paused, "gateway_connections") == 2

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
    assert value(done, "gateway_approval_decisions_total", outcome="approve") == 1
    assert value(done, "gateway_approval_decisions_total", outcome="reject") == 0
    assert value(done, "gateway_runs_total", state="resumed") == 1
    assert value(done, "gateway_runs_total", state="completed") == 1
    assert value(done, "gateway_runs_total", state="failed") == 0
    events = value(done, "gateway_events_appended_total")
    assert events > value(paused, "gateway_events_appended_total") > 0
    # Every stored event went through a timed transaction.
    assert value(done, "gateway_storage_commit_batch_events_sum") == events
    assert value(done, "gateway_storage_commit_seconds_count") >= 1
    assert value(done, "gateway_storage_errors_total") == 0


async def test_no_metrics_route_unless_enabled(gateway: Gateway) -> None:
    async with gateway.http() as http:
        response = await http.get("/metrics")
    assert response.status_code == 404
