"""The container image (deploy/Dockerfile), run as users run it: hardened, configured by
environment only, on SQLite with a data volume, and as two replicas on PostgreSQL and Redis
that take each other's runs over (after SIGKILL) and hand them over (on SIGTERM).

tests/support/containers.py says how the image is built offline with podman.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from gateway.agents.demo.assistant import refund_text
from gateway.auth.access import TokenVerifier
from tests.support.client import Client
from tests.support.containers import (
    IMAGE_TEST_MARKS,
    Container,
    image_size_bytes,
    podman,
    replicas_env,
    run_container,
    run_once,
    start_replicas,
)
from tests.support.gateway import TEST_SECRET
from tests.support.postgres import postgres_database
from tests.support.redis import free_port, require_redis

pytestmark = IMAGE_TEST_MARKS

TOKENS = TokenVerifier(TEST_SECRET)
STORY = "tell me a story"
REFUND = "refund order 42 for 30 dollars"
# Five tool turns at 15 ms a delta: long enough to stop its gateway in the middle.
STATUS_INPUT = "status of orders 11, 12, 13, 14 and 15"
TERMINAL = ("run.completed", "run.failed", "run.cancelled")
# Start-up on this 2-core machine, with the first start's migrations: a few seconds.
READY_WITHIN_S = 60.0


def token(user: str, *roles: str) -> str:
    return TOKENS.issue(user, "acme", roles or ("user",))


def dense(events: list[dict[str, Any]]) -> bool:
    return [e["seq"] for e in events] == list(range(1, len(events) + 1))


def text_of(events: list[dict[str, Any]], run_id: str) -> str:
    return "".join(
        e["data"]["delta"]
        for e in events
        if e["run_id"] == run_id and e["event"] == "message.delta" and "delta" in e["data"]
    )


async def finished(client: Client, run_id: str, timeout: float = 60) -> dict[str, Any]:
    return await client.wait_for(
        lambda f: f.get("type") == "event" and f["run_id"] == run_id and f["event"] in TERMINAL,
        timeout,
    )


async def test_the_image_serves_a_story_and_an_approval_on_sqlite(
    image: str, containers: list[Container]
) -> None:
    """Read-only root, /tmp a tmpfs, no capabilities, a non-root user, SQLite on a volume:
    ready, healthy by its own HEALTHCHECK, a story streams, an approval pauses and continues,
    SIGTERM stops it cleanly, and a new start finds the thread on the volume."""
    env = {"GATEWAY_SECRET": TEST_SECRET, "GATEWAY_DEMO_DELAY_MS": "0"}
    gw = run_container(free_port(), env, data_volume=True)
    containers.append(gw)
    startup_s = await gw.wait_ready(READY_WITHIN_S)

    assert podman("healthcheck", "run", gw.name, check=False).returncode == 0
    assert podman("exec", gw.name, "id", "-u").stdout.strip() == "10001"
    assert podman("exec", gw.name, "touch", "/opt/gateway/x", check=False).returncode != 0
    async with httpx.AsyncClient(base_url=gw.http_url, timeout=10) as http:
        assert (await http.get("/healthz")).status_code == 200

    alice = await Client.connect(gw.ws_url, token("alice"))
    bob = await Client.connect(gw.ws_url, token("bob", "reviewer"))
    try:
        story = await alice.request("run.start", input=STORY)
        assert (await finished(alice, story["run_id"]))["event"] == "run.completed"
        assert len(text_of(alice.events, story["run_id"]).split()) >= 200

        refund = await alice.request("run.start", input=REFUND)
        requested = await alice.wait_event("approval.requested", timeout=30)
        assert requested["data"]["arguments"] == {"order_id": 42, "amount": 30.0}
        await alice.wait_event("run.paused", timeout=30)
        decided = await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        assert decided["approval"]["status"] == "approved"
        assert (await finished(alice, refund["run_id"]))["event"] == "run.completed"
        assert refund_text(42, 30.0) in text_of(alice.events, refund["run_id"])
        assert dense(alice.events_of(refund["thread_id"]))
    finally:
        await alice.close()
        await bob.close()

    gw.stop()
    assert gw.exit_code() == 0, gw.logs()
    assert "Application shutdown complete" in gw.logs()

    gw.start()
    restart_s = await gw.wait_ready(READY_WITHIN_S)
    async with httpx.AsyncClient(
        base_url=gw.http_url, timeout=10, headers={"Authorization": f"Bearer {token('alice')}"}
    ) as http:
        stored = await http.get(f"/v1/threads/{refund['thread_id']}/events")
    assert stored.status_code == 200
    assert stored.json()["events"][-1]["event"] == "run.completed"
    # The figures of docs/benchmarks.md "The container image" (`pytest -s` shows them).
    figures = {
        "image_mb": round(image_size_bytes() / 1e6, 1),
        "first_start_s": round(startup_s, 2),
        "restart_s": round(restart_s, 2),
    }
    print(json.dumps({"part": "container", **figures}))


async def test_two_replicas_on_postgresql_take_over_and_hand_over_runs(
    image: str, containers: list[Container]
) -> None:
    """Migrations once (the image's `migrate`), then two replicas with `--no-migrate` and
    their own instance ids on one database and one Redis. SIGKILL of A mid-run: B takes the
    run over once A's lease expires. A starts again; SIGTERM of B mid-run: B hands the run
    over and A continues it at once, repeating no tool call."""
    redis_url = require_redis()
    async with postgres_database("gw_deploy") as database_url:
        common = replicas_env(
            database_url, redis_url, GATEWAY_LEASE_TTL_S="2", GATEWAY_LEASE_SCAN_S="0.5"
        )
        a, b = start_replicas(common, containers)
        current = run_once(common, "migrate", "--current")
        assert "up to date" in current.stdout + current.stderr, current.stdout + current.stderr
        await a.wait_ready(READY_WITHIN_S)
        await b.wait_ready(READY_WITHIN_S)

        # A crash: SIGKILL of A while it streams; B's lease scan takes the run over.
        starter = await Client.connect(a.ws_url, token("alice"))
        watcher = await Client.connect(b.ws_url, token("alice"))
        try:
            run = await starter.request("run.start", input=STATUS_INPUT)
            await watcher.request("thread.subscribe", thread_id=run["thread_id"], after_seq=0)
            await watcher.wait_event("tool.output", timeout=30)
            a.kill()
            await watcher.wait_event("run.recovered", timeout=30)
            assert (await finished(watcher, run["run_id"]))["event"] == "run.completed"
            assert dense(watcher.events_of(run["thread_id"]))
            assert "took over 1 run(s) whose lease had expired" in b.logs()
        finally:
            await starter.close()
            await watcher.close()

        # A graceful stop: A again under its id, then SIGTERM of B while it streams.
        a.start()
        await a.wait_ready(READY_WITHIN_S)
        starter = await Client.connect(b.ws_url, token("alice"))
        watcher = await Client.connect(a.ws_url, token("alice"))
        try:
            run = await starter.request("run.start", input=STATUS_INPUT)
            await watcher.request("thread.subscribe", thread_id=run["thread_id"], after_seq=0)
            await watcher.wait_event("tool.output", timeout=30)
            b.stop()
            paused = await watcher.wait_event("run.paused", timeout=30)
            assert paused["data"]["reason"] == "shutdown"
            await watcher.wait_event("run.resumed", timeout=10)
            assert (await finished(watcher, run["run_id"]))["event"] == "run.completed"
            events = watcher.events_of(run["thread_id"])
            assert dense(events)
            calls = [
                e["data"]["arguments"]["order_id"] for e in events if e["event"] == "tool.called"
            ]
            assert calls == [11, 12, 13, 14, 15]
            assert "handed over by a process shutting down" in a.logs()
            assert b.exit_code() == 0, b.logs()
        finally:
            await starter.close()
            await watcher.close()
        # Containers go before the database they hold connections to.
        for container in containers:
            container.remove()
