"""Signed webhooks from the durable outbox (docs/protocol.md §10), against a receiver on
loopback: what is delivered and how it is signed, retries of a failing and of a slow receiver
under one stable id, a gateway killed with deliveries pending that delivers them after its
restart, and sensitive arguments masked."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from gateway.event_log.webhook_signature import verify
from gateway.run_lifecycle.sensitive_arguments import MASK
from gateway.settings import SettingsError, load_settings
from persistence.backends import open_store
from persistence.clock import utcnow
from persistence.schema import migrate
from persistence.tables import webhook_deliveries
from persistence.webhooks import DeliveryStatus, WebhookRepository
from tests.integration.test_final_checkpoints import one_graph, overrunner
from tests.support.agents import VAULT_CARD, EffectLog, say, sensitive_registry
from tests.support.gateway import Gateway, GatewayProcess, spawn_gateway
from tests.support.specs import openapi

pytestmark = pytest.mark.both_backends

SECRET = "webhook-secret-" + "w" * 24
REFUND = "refund order 42 for 30 dollars"
# Small waits, so retries happen within the test's patience.
FAST = {
    "webhook_secret": SECRET,
    "webhook_backoff_s": 0.2,
    "webhook_max_backoff_s": 0.5,
    "webhook_poll_s": 0.2,
    "webhook_timeout_s": 2.0,
}


@dataclass
class Received:
    headers: dict[str, str]
    body: str

    @property
    def payload(self) -> dict[str, Any]:
        return dict(json.loads(self.body))

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]


@dataclass
class Receiver:
    """Records every request (as it arrives); answers 500 to the first `fail_first`, and the
    next `slow_first` only after `slow_s`."""

    fail_first: int = 0
    slow_first: int = 0
    slow_s: float = 0.0
    requests: list[Received] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.requests.append(Received(headers, body.decode()))
        n = len(self.requests)
        status = 200
        if n <= self.fail_first:
            status = 500
        elif n <= self.fail_first + self.slow_first:
            await asyncio.sleep(self.slow_s)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def of_type(self, type_: str) -> list[Received]:
        return [r for r in self.requests if r.payload["type"] == type_]

    async def wait_for(self, type_: str, count: int = 1, timeout: float = 30) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.of_type(type_)) < count:
            if time.monotonic() > deadline:
                seen = [r.payload["type"] for r in self.requests]
                raise AssertionError(f"no {count} x {type_} webhook; got {seen}")
            await asyncio.sleep(0.02)
        return self.of_type(type_)


@contextlib.asynccontextmanager
async def serving(receiver: Receiver, port: int = 0) -> AsyncIterator[Receiver]:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    # Requests held open by a slow receiver are cut at the end instead of waited for.
    config = uvicorn.Config(
        receiver, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    receiver.port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield receiver
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def process_env(database_url: str, receiver: Receiver, events: str, **more: str) -> dict[str, str]:
    """The environment of a gateway subprocess sending `events` to `receiver`, quickly."""
    return {
        "GATEWAY_DATABASE_URL": database_url,
        "GATEWAY_WEBHOOK_URL": receiver.url,
        "GATEWAY_WEBHOOK_SECRET": SECRET,
        "GATEWAY_WEBHOOK_EVENTS": events,
        "GATEWAY_WEBHOOK_BACKOFF_S": "0.2",
        "GATEWAY_WEBHOOK_POLL_S": "0.2",
        **{f"GATEWAY_WEBHOOK_{name.upper()}": value for name, value in more.items()},
    }


def headers_of(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def start_run(url: str, token: str, text: str, agent: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"input": text}
    if agent is not None:
        body["agent"] = agent
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.post("/v1/runs", json=body, headers=headers_of(token))
    assert response.status_code in (200, 201, 202), response.text
    return dict(response.json())


async def decide(url: str, token: str, approval_id: str, decision: str = "approve") -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.post(
            f"/v1/approvals/{approval_id}/decision",
            json={"decision": decision, "reason": "looks right"},
            headers=headers_of(token),
        )
    assert response.status_code == 200, response.text


def assert_signed(request: Received) -> None:
    headers = request.headers
    assert headers["content-type"] == "application/json"
    assert headers["webhook-signature"].startswith("v1=")
    assert verify(SECRET, headers["webhook-timestamp"], request.body, headers["webhook-signature"])
    assert not verify(
        "another-secret-entirely",
        headers["webhook-timestamp"],
        request.body,
        headers["webhook-signature"],
    )
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 120
    payload = request.payload
    assert payload["id"] == request.id
    # As the OpenAPI document describes it (its `webhooks`).
    spec = openapi()
    schema = spec.document["webhooks"][payload["type"]]["post"]["requestBody"]["content"]
    data_ref = schema["application/json"]["schema"]["allOf"][1]["properties"]["data"]["$ref"]
    assert spec.errors("WebhookMessage", payload) == []
    assert spec.errors(data_ref.rsplit("/", 1)[1], payload["data"]) == []


async def test_an_approved_refund_is_announced_signed_once_per_event(
    gateway_factory: Any,
) -> None:
    async with (
        serving(Receiver()) as receiver,
        gateway_factory(webhook_url=receiver.url, **FAST) as gw,
    ):
        gw: Gateway
        run = await start_run(gw.http_url, gw.token("alice", "user"), REFUND)
        (requested,) = await receiver.wait_for("approval.requested")
        data = requested.payload["data"]
        assert data["tool_name"] == "issue_refund"
        assert data["arguments"] == {"order_id": 42, "amount": 30}
        assert data["agent"]
        await decide(gw.http_url, gw.token("rita", "reviewer"), data["approval_id"])
        (decided,) = await receiver.wait_for("approval.decided")
        (completed,) = await receiver.wait_for("run.completed")

    for request in receiver.requests:
        assert_signed(request)
        payload = request.payload
        assert payload["tenant"] == "acme"
        assert payload["thread_id"] == run["thread_id"]
        assert payload["run_id"] == run["run_id"]
        assert isinstance(payload["seq"], int) and payload["created_at"].endswith("Z")
    assert decided.payload["data"] | {"decided_at": None} == {
        "approval_id": data["approval_id"],
        "decision": "approve",
        "reason": "looks right",
        "reviewer": "rita",
        "decided_at": None,
        "tool_name": "issue_refund",
        "agent": data["agent"],
        "status": "approved",
    }
    assert "final_output" in completed.payload["data"]
    ids = [r.id for r in receiver.requests]
    assert len(ids) == len(set(ids)) == 3  # nothing else announced, nothing twice
    seqs = [requested.payload["seq"], decided.payload["seq"], completed.payload["seq"]]
    assert seqs == sorted(seqs)


async def test_a_failing_receiver_gets_the_same_delivery_again_until_it_takes_it(
    gateway_factory: Any, database_url: str
) -> None:
    async with (
        serving(Receiver(fail_first=3)) as receiver,
        gateway_factory(
            webhook_url=receiver.url, webhook_events="approval.requested", metrics=True, **FAST
        ) as gw,
    ):
        await start_run(gw.http_url, gw.token("alice", "user"), REFUND)
        attempts = await receiver.wait_for("approval.requested", count=4)
        await asyncio.sleep(0.8)  # a taken delivery is not sent again
        assert len(receiver.requests) == 4
        async with gw.http() as http:
            scraped = (await http.get("/metrics")).text
        assert 'gateway_webhook_attempts_total{outcome="retried"} 3.0' in scraped
        assert 'gateway_webhook_attempts_total{outcome="delivered"} 1.0' in scraped
        assert 'gateway_webhook_attempts_total{outcome="failed"} 0.0' in scraped
    assert len({r.id for r in attempts}) == 1
    assert len({r.body for r in attempts}) == 1  # the same body, signed anew each time
    for request in attempts:
        assert_signed(request)
    store = open_store(database_url)
    try:
        repository = WebhookRepository(store)
        assert await repository.of_status(DeliveryStatus.PENDING) == []
        assert await repository.of_status(DeliveryStatus.FAILED) == []
    finally:
        await store.close()


async def test_a_receiver_slower_than_the_timeout_is_tried_again(gateway_factory: Any) -> None:
    receiver = Receiver(slow_first=1, slow_s=3.0)
    settings = {**FAST, "webhook_timeout_s": 0.5}
    async with (
        serving(receiver),
        gateway_factory(
            webhook_url=receiver.url, webhook_events="approval.requested", **settings
        ) as gw,
    ):
        await start_run(gw.http_url, gw.token("alice", "user"), REFUND)
        first, again = await receiver.wait_for("approval.requested", count=2)
    assert first.id == again.id


async def test_a_receiver_that_never_takes_it_gets_the_configured_attempts_then_it_fails(
    gateway_factory: Any, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    async with (
        serving(Receiver(fail_first=1000)) as receiver,
        gateway_factory(
            webhook_url=receiver.url,
            webhook_events="approval.requested",
            webhook_max_attempts=3,
            **FAST,
        ) as gw,
    ):
        await start_run(gw.http_url, gw.token("alice", "user"), REFUND)
        await receiver.wait_for("approval.requested", count=3)
        store = open_store(database_url)
        try:
            repository = WebhookRepository(store)
            deadline = time.monotonic() + 10
            while not (failed := await repository.of_status(DeliveryStatus.FAILED)):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        finally:
            await store.close()
        await asyncio.sleep(0.8)
        assert len(receiver.requests) == 3
    assert failed[0]["attempts"] == 3 and failed[0]["last_error"] == "HTTP 500"
    gave_up = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
    assert len(gave_up) == 1 and failed[0]["message_id"] in gave_up[0]
    for record in caplog.records:
        text = record.getMessage()
        assert SECRET not in text and "/hooks" not in text and "order_id" not in text


async def test_sensitive_arguments_are_masked_in_webhooks(gateway_factory: Any) -> None:
    async with (
        serving(Receiver()) as receiver,
        gateway_factory(registry=sensitive_registry(), webhook_url=receiver.url, **FAST) as gw,
    ):
        await start_run(gw.http_url, gw.token("alice", "user"), "charge it", agent="vault")
        (requested,) = await receiver.wait_for("approval.requested")
        data = requested.payload["data"]
        assert data["arguments"] == {"card": MASK, "value": "1"}
        assert data["masked"] == ["card"]
        await decide(gw.http_url, gw.token("rita", "reviewer"), data["approval_id"])
        await receiver.wait_for("run.completed")
    for request in receiver.requests:
        assert VAULT_CARD not in request.body
        assert_signed(request)


async def test_deliveries_pending_when_the_gateway_is_killed_are_sent_after_its_restart(
    database_url: str, tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    """The receiver holds the first attempt open while the gateway is SIGKILLed: the claim of
    the dead process runs out, and the restarted one delivers under the same id."""
    receiver = Receiver(slow_first=1, slow_s=20.0)
    async with serving(receiver):
        env = process_env(database_url, receiver, "approval.requested,run.completed", timeout_s="1")
        first = spawn_gateway(tmp_path, env=env)
        processes.append(first)
        url = f"http://127.0.0.1:{first.port}"
        token = Gateway(first.port, load_settings()).token("alice", "user")
        await start_run(url, token, REFUND)
        (in_flight,) = await receiver.wait_for("approval.requested")
        first.kill()

        second = spawn_gateway(tmp_path, env=env)
        processes.append(second)
        first_try, again = await receiver.wait_for("approval.requested", count=2)
        assert again.id == first_try.id == in_flight.id
        url = f"http://127.0.0.1:{second.port}"
        reviewer = Gateway(second.port, load_settings()).token("rita", "reviewer")
        await decide(url, reviewer, again.payload["data"]["approval_id"])
        await receiver.wait_for("run.completed")
    for request in receiver.requests:
        assert_signed(request)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"webhook_url": "ftp://example.com/x"}, "GATEWAY_WEBHOOK_URL"),
        ({"webhook_url": "hooks.example.com"}, "not an http:// or https:// URL"),
        ({"webhook_url": "https://u:p@example.com/x"}, "must not contain credentials"),
        ({"webhook_url": "https://example.com/x"}, "GATEWAY_WEBHOOK_SECRET must be too"),
        (
            {"webhook_url": "https://example.com/x", "webhook_secret": "short"},
            "at least 16 characters",
        ),
        ({"webhook_events": "run.completed,run.exploded"}, "GATEWAY_WEBHOOK_EVENTS"),
    ],
)
def test_bad_webhook_settings_stop_start_up_with_a_clear_error(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError) as error:
        load_settings(**overrides)
    assert message in str(error.value)


async def test_an_approval_nobody_decides_in_time_is_announced_as_expired(
    gateway_factory: Any,
) -> None:
    async with (
        serving(Receiver()) as receiver,
        gateway_factory(
            webhook_url=receiver.url, approval_ttl_s=0.5, approval_sweep_s=0.2, **FAST
        ) as gw,
    ):
        await start_run(gw.http_url, gw.token("alice", "user"), REFUND)
        (requested,) = await receiver.wait_for("approval.requested")
        (expired,) = await receiver.wait_for("approval.expired")
        # The rejected call ends the run: it completes, telling the user so.
        await receiver.wait_for("run.completed")
    data = expired.payload["data"]
    assert data["approval_id"] == requested.payload["data"]["approval_id"]
    assert data["expired"] is True and data["reviewer"] is None
    assert data["status"] == "expired" and data["decision"] == "reject"
    assert receiver.of_type("approval.decided") == []
    for request in receiver.requests:
        assert_signed(request)


async def test_two_dispatchers_never_hold_one_delivery_and_a_dead_ones_claims_run_out(
    database_url: str,
) -> None:
    store = open_store(database_url)
    try:
        await migrate(store)
        now = utcnow()
        rows = [
            {
                "message_id": f"msg_{n}",
                "endpoint": "http://127.0.0.1:9/hooks",
                "type": "run.completed",
                "payload": "{}",
                "status": DeliveryStatus.PENDING.value,
                "attempts": 0,
                "created_at": now,
                "next_attempt_at": now,
            }
            for n in range(40)
        ]
        await store.write(lambda conn: conn.execute(webhook_deliveries.insert(), rows))
        repository = WebhookRepository(store)
        # Claims at the same moment, as two processes polling together make them.
        claims = await asyncio.gather(
            *(repository.claim(f"p{n}", hold_s=30, limit=16, now=now) for n in range(4))
        )
        held = [d.message_id for claim in claims for d in claim]
        assert len(held) == len(set(held)) == 40
        assert await repository.claim("late", hold_s=30, limit=100, now=now) == []
        # Due, but held: nothing can be claimed before the claims run out.
        assert await repository.next_due() == now + timedelta(seconds=30)
        # The holders die: once their claims run out, everything is claimable again, once.
        later = now + timedelta(seconds=31)
        again = await repository.claim("heir", hold_s=30, limit=100, now=later)
        assert sorted(d.message_id for d in again) == sorted(held)
        assert await repository.claim("late", hold_s=30, limit=100, now=later) == []
        # A dead holder's late outcome does not touch the heir's claim.
        await repository.delivered(claims[0][0], "p0")
        assert len(await repository.of_status(DeliveryStatus.PENDING)) == 40
        await repository.delivered(again[0], "heir")
        assert len(await repository.of_status(DeliveryStatus.PENDING)) == 39
    finally:
        await store.close()


async def test_a_gateway_stopped_mid_attempt_leaves_the_delivery_to_the_next_at_once(
    database_url: str, tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    """A graceful stop gives its claims back: the next process need not wait for them to run
    out (here the claim would last 35 s)."""
    receiver = Receiver(slow_first=1, slow_s=20.0)
    async with serving(receiver):
        env = process_env(database_url, receiver, "approval.requested", timeout_s="30")
        first = spawn_gateway(tmp_path, env=env)
        processes.append(first)
        token = Gateway(first.port, load_settings()).token("alice", "user")
        await start_run(f"http://127.0.0.1:{first.port}", token, REFUND)
        (in_flight,) = await receiver.wait_for("approval.requested")
        first.terminate()
        processes.append(spawn_gateway(tmp_path, env=env))
        _, again = await receiver.wait_for("approval.requested", count=2, timeout=15)
        assert again.id == in_flight.id


async def test_two_gateways_on_one_database_deliver_each_webhook_once(
    database_url: str, tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    async with serving(Receiver()) as receiver:
        # Both look at the table all the time, racing for every row.
        env = process_env(database_url, receiver, "approval.requested", poll_s="0.05")
        for name in ("gw-a", "gw-b"):
            processes.append(spawn_gateway(tmp_path, env={**env, "GATEWAY_INSTANCE_ID": name}))
        token = Gateway(0, load_settings()).token("alice", "user")
        await asyncio.gather(
            *(
                start_run(f"http://127.0.0.1:{process.port}", token, f"refund order {n} for 5")
                for n, process in enumerate(processes * 4)
            )
        )
        requested = await receiver.wait_for("approval.requested", count=8)
        await asyncio.sleep(1.0)
    assert len(receiver.requests) == 8
    assert len({r.id for r in requested}) == 8
    assert len({r.payload["run_id"] for r in requested}) == 8


async def test_a_failed_run_is_announced_with_its_error(gateway_factory: Any) -> None:
    graph = overrunner(EffectLog(), say("first turn"))
    async with (
        serving(Receiver()) as receiver,
        gateway_factory(registry=one_graph(graph), webhook_url=receiver.url, **FAST) as gw,
    ):
        run = await start_run(gw.http_url, gw.token("alice", "user"), "look it up")
        (failed,) = await receiver.wait_for("run.failed")
    assert failed.payload["run_id"] == run["run_id"]
    assert failed.payload["data"]["error"]["code"] == "max_turns"
    assert_signed(failed)
    assert [r.payload["type"] for r in receiver.requests] == ["run.failed"]
