"""`serve --workers N` (gateway/server/workers.py): N gateway processes on one port.

Connections spread over the workers; runs, decisions and subscriptions work across them (over
Redis); a development token minted by one worker is good on all; a worker killed with SIGKILL
is started again under its instance id and takes its runs over at once; SIGTERM stops them all.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import websockets

from tests.support.client import Client
from tests.support.gateway import GatewayProcess, spawn_gateway
from tests.support.redis import bus_prefix, require_redis
from tests.support.storage import rows

pytestmark = pytest.mark.both_backends

REFUND = "refund order 42 for 30 dollars"
STATUS_INPUT = "status of orders 11, 12, 13, 14 and 15"
# Long enough that a takeover before it can only be the restarted worker's own.
LEASE_TTL_S = 60
STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")


def worker_pids(gateway: GatewayProcess) -> dict[int, int]:
    """The newest pid of each worker, from the supervisor's log."""
    return {int(index): int(pid) for index, pid in STARTED.findall(gateway.log())}


def alive(pid: int) -> bool:
    """Running (a zombie that nobody has reaped yet has stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def connections_served(port: int) -> Counter[int]:
    """How many established connections on `port` (the server side) each process holds."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return Counter(int(pid) for pid in re.findall(r"pid=(\d+)", out))


def serving_pids(port: int) -> set[int]:
    """The processes holding established connections on `port` (the server side)."""
    return set(connections_served(port))


async def dev_token(port: int, user: str, *roles: str) -> str:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        response = await http.post(
            "/v1/dev/token", json={"user": user, "roles": list(roles) or ["user"]}
        )
    assert response.status_code == 200, response.text
    return str(response.json()["token"])


@pytest.fixture
def workers(tmp_path: Path, database_url: str, processes: list[GatewayProcess]) -> GatewayProcess:
    gateway = spawn_gateway(
        tmp_path,
        env={
            "GATEWAY_DATABASE_URL": database_url,
            "GATEWAY_BUS_URL": require_redis(),
            "GATEWAY_BUS_PREFIX": bus_prefix(),
            "GATEWAY_INSTANCE_ID": "gw",
            "GATEWAY_DEMO_DELAY_MS": "15",
            "GATEWAY_LEASE_TTL_S": str(LEASE_TTL_S),
            # Development mode: the workers must share one signing secret.
            "GATEWAY_SECRET": "",
        },
        args=["--workers", "2"],
    )
    processes.append(gateway)
    return gateway


async def test_two_workers_share_the_port_and_each_others_runs(workers: GatewayProcess) -> None:
    url = workers.ws_url
    clients: list[Client] = []
    try:
        # Tokens minted by whichever worker answered, used on whichever worker accepts. The
        # kernel hands each connection to a worker waiting in accept: connect until both
        # serve some (a busy worker may miss a few).
        pids = worker_pids(workers)
        assert len(pids) == 2
        while serving_pids(workers.port) != set(pids.values()):
            assert len(clients) < 64, f"every connection went to one worker: {pids}"
            token = await dev_token(workers.port, "alice")
            clients.append(await Client.connect(url, token))
        while len(clients) < 8:
            clients.append(await Client.connect(url, await dev_token(workers.port, "alice")))

        reviewer = await Client.connect(url, await dev_token(workers.port, "rita", "reviewer"))
        clients.append(reviewer)
        for starter, watcher in zip(clients[0:4], clients[4:8], strict=True):
            ack = await starter.request("run.start", input=REFUND)
            thread_id = ack["thread_id"]
            await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
            requested = await watcher.wait_event("approval.requested", timeout=15)
            await reviewer.request(
                "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
            )
            done = await watcher.wait_event("run.completed", timeout=15)
            events = watcher.events_of(thread_id)
            assert [e["seq"] for e in events] == list(range(1, done["seq"] + 1))
            assert [e["event"] for e in events].count("tool.output") == 1
    finally:
        for client in clients:
            await client.close()


async def test_a_burst_of_connections_is_spread_over_the_workers(
    workers: GatewayProcess,
) -> None:
    """A burst of connections arriving at once (clients reconnecting after a network blip, a
    load test) is shared by the workers, not taken whole by whichever wakes first: each worker
    listens on a socket of its own in the port's SO_REUSEPORT group, and the kernel hashes each
    connection to one of them."""
    pids = worker_pids(workers)
    burst = 100
    sockets = await asyncio.gather(*(websockets.connect(workers.ws_url) for _ in range(burst)))
    try:
        served = connections_served(workers.port)
        assert sum(served.values()) == burst, served
        assert set(served) == set(pids.values()), served
        # Hashed over two sockets, each gets 50 +- 5 (one standard deviation): under 25 for
        # either would take five standard deviations, or the burst going to one worker.
        assert min(served.values()) >= burst // 4, served
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))


async def test_a_killed_worker_is_started_again_and_takes_its_run_over_at_once(
    workers: GatewayProcess, database_url: str
) -> None:
    token = await dev_token(workers.port, "alice")
    watcher = await Client.connect(workers.ws_url, token)
    starter = await Client.connect(workers.ws_url, token)
    try:
        ack = await starter.request("run.start", input=STATUS_INPUT)
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        await watcher.wait_event("tool.output")
        ((owner,),) = await rows(
            database_url, "SELECT lease_owner FROM runs WHERE run_id = ?", run_id
        )
        index = int(str(owner).rsplit("/", 1)[1])
        killed = worker_pids(workers)[index]
        os.kill(killed, signal.SIGKILL)
        killed_at = time.monotonic()
        # The watcher may have been on the killed worker: it reconnects (to either) and
        # resumes from its cursor, as any client would. The kernel may hand the connection to
        # the killed worker's socket, where it waits in the backlog until the worker started
        # again is up: 20 s on a loaded two-core machine, past websockets' 10 s by default.
        seen = watcher.events_of(thread_id)
        await watcher.close()
        watcher = await Client.connect(workers.ws_url, token, open_timeout=LEASE_TTL_S)
        await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=seen[-1]["seq"])

        recovered = await watcher.wait_event("run.recovered", timeout=LEASE_TTL_S)
        taken_over_s = time.monotonic() - killed_at
        done = await watcher.wait_event("run.completed", timeout=30)
        events = seen + watcher.events_of(thread_id)
        assert [e["seq"] for e in events] == list(range(1, done["seq"] + 1))
        assert recovered["seq"] < done["seq"]
        assert worker_pids(workers)[index] != killed
        assert f"worker {index} exited with signal 9; starting it again" in workers.log()
        # By the worker started again under the same instance id, as soon as it is up: the
        # other worker could only have taken the run over once its lease expired.
        assert taken_over_s < LEASE_TTL_S, taken_over_s
        assert "recovered 1 run(s) left active by a previous process" in workers.log()
    finally:
        await watcher.close()
        await starter.close()


async def test_sigterm_stops_every_worker(workers: GatewayProcess) -> None:
    pids = worker_pids(workers)
    await asyncio.to_thread(workers.terminate)
    assert workers.process.returncode == 0
    assert not any(alive(pid) for pid in pids.values())


async def test_workers_stop_when_their_supervisor_is_killed(workers: GatewayProcess) -> None:
    pids = worker_pids(workers)
    workers.kill()
    deadline = time.monotonic() + 45
    while any(alive(pid) for pid in pids.values()):
        assert time.monotonic() < deadline, "workers outlived their supervisor"
        await asyncio.sleep(0.1)
