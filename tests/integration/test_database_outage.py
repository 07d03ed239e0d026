"""PostgreSQL unreachable for a few seconds under two gateway processes.

The gateways reach the test's database through a TCP proxy the test cuts (every connection
closed, new ones refused) and restores. While it is cut, `/readyz` says 503 and a `run.start`
either answers `unavailable` or waits for the database (writes are retried for a while); once
it is back, `/readyz` says 200 again, new runs start and end, the run that was streaming when
the database went away ends too, and what every client received is the stored log, dense,
with no run that was not acknowledged.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url

from gateway.auth.access import TokenVerifier
from tests.support.client import Client, ProtocolFailure
from tests.support.gateway import TEST_SECRET, GatewayProcess, spawn_gateway
from tests.support.postgres import postgres_database
from tests.support.redis import bus_prefix, require_redis
from tests.support.storage import rows
from tests.support.tcp_proxy import tcp_proxy

TOKEN = TokenVerifier(TEST_SECRET)
STORY = "tell me a story"
OUTAGE_S = 3.0


async def readyz(process: GatewayProcess) -> int:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{process.port}") as http:
        return (await http.get("/readyz", timeout=10)).status_code


async def wait_ready(process: GatewayProcess, status: int) -> None:
    deadline = time.monotonic() + 30
    while (now := await readyz(process)) != status:
        assert time.monotonic() < deadline, f"/readyz stayed {now}"
        await asyncio.sleep(0.2)


async def test_postgres_unreachable_for_a_while_then_back(
    tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    async with postgres_database() as url:
        server = make_url(url)
        async with tcp_proxy(server.host or "127.0.0.1", server.port or 5432) as proxy:
            through_proxy = server.set(port=proxy.port).render_as_string(hide_password=False)
            env = {
                "GATEWAY_DATABASE_URL": through_proxy,
                "GATEWAY_BUS_URL": require_redis(),
                "GATEWAY_BUS_PREFIX": bus_prefix(),
                "GATEWAY_DEMO_DELAY_MS": "10",
                "GATEWAY_LEASE_TTL_S": "4",
            }
            # In threads: the proxy runs on this event loop, and a gateway starting up needs it.
            a, b = await asyncio.gather(
                *(
                    asyncio.to_thread(
                        spawn_gateway, tmp_path, env={**env, "GATEWAY_INSTANCE_ID": name}
                    )
                    for name in ("gw-a", "gw-b")
                )
            )
            processes.extend([a, b])
            token = TOKEN.issue("alice", "acme", ["user"])
            starter = await Client.connect(a.ws_url, token)
            watcher = await Client.connect(b.ws_url, token)
            seen: list[dict[str, Any]] = []
            try:
                ack = await starter.request("run.start", input=STORY)
                streaming = ack["thread_id"]
                await watcher.request("thread.subscribe", thread_id=streaming, after_seq=0)
                await watcher.wait_event("message.delta")

                await proxy.cut()
                cut_at = time.monotonic()
                await wait_ready(a, 503)
                await wait_ready(b, 503)
                # Sent while the database is away: the gateway retries its writes for a while,
                # so the answer is either `unavailable` or, the outage being shorter, the run
                # started once the database is back; never both, never twice.
                during = asyncio.create_task(starter.request("run.start", input=STORY))
                await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut_at)))
                await proxy.restore()

                await wait_ready(a, 200)
                await wait_ready(b, 200)
                try:
                    started_during: dict[str, Any] | None = await during
                except ProtocolFailure as refused:
                    assert refused.code == "unavailable"
                    started_during = None
                # A watcher whose reads failed meanwhile may have been closed: it reconnects
                # and resumes from its cursor, as any client does.
                seen = watcher.events_of(streaming)
                await watcher.close()
                watcher = await Client.connect(b.ws_url, token)
                after = seen[-1]["seq"] if seen else 0
                await watcher.request("thread.subscribe", thread_id=streaming, after_seq=after)
                await watcher.wait_event("run.completed", timeout=60)
                fresh = await starter.request("run.start", input=STORY)
                for started in (fresh, started_during):
                    if started is not None:
                        await starter.wait_for(
                            lambda f, r=started["run_id"]: (
                                f.get("event") == "run.completed" and f.get("run_id") == r
                            ),
                            timeout=30,
                        )
            finally:
                await starter.close()
                await watcher.close()

            received = [(streaming, seen + watcher.events_of(streaming))]
            received += [
                (started["thread_id"], starter.events_of(started["thread_id"]))
                for started in (fresh, started_during)
                if started is not None
            ]
            for thread_id, events in received:
                assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
                stored = await rows(
                    through_proxy,
                    "SELECT seq, type FROM events WHERE thread_id = ? ORDER BY seq",
                    thread_id,
                )
                assert [(e["seq"], e["event"]) for e in events] == [tuple(r) for r in stored]
            # Nothing but the runs that were acknowledged.
            assert await rows(through_proxy, "SELECT count(*) FROM runs") == [(len(received),)]
