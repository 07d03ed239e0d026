"""deploy/nginx/, the reverse proxy of deploy/compose.yaml, in front of two replicas from the
image: WebSocket connections are spread over both, and an SSE feed streams through it event
by event, unbuffered.

The proxy is the machine's nginx (Debian's package) with the committed configuration; only
where it listens and where the replicas are differ from the compose file's (the replicas listen
on the host's network here, not under their service names).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.client import Client
from tests.support.containers import (
    IMAGE_TEST_MARKS,
    ROOT,
    Container,
    missing,
    replicas_env,
    start_replicas,
)
from tests.support.postgres import postgres_database
from tests.support.redis import free_port, require_redis

from .test_image import STORY, finished, token

pytestmark = IMAGE_TEST_MARKS

NGINX_DIR = ROOT / "deploy" / "nginx"
ACCEPTED = '"WebSocket /v1/ws" [accepted]'


def nginx_config(workdir: Path, port: int, replicas: list[Container]) -> Path:
    """The committed configuration, listening on `port`, with the replicas' host ports."""
    main = (NGINX_DIR / "nginx.conf").read_text()
    assert "listen 8080;" in main
    (workdir / "nginx.conf").write_text(main.replace("listen 8080;", f"listen 127.0.0.1:{port};"))
    shutil.copy(NGINX_DIR / "gateway-locations.conf", workdir / "gateway-locations.conf")
    upstream = (NGINX_DIR / "upstream-compose.conf").read_text()
    for service, replica in zip(("gateway-a", "gateway-b"), replicas, strict=True):
        assert f"server {service}:8000;" in upstream
        upstream = upstream.replace(f"{service}:8000", f"127.0.0.1:{replica.port}")
    (workdir / "gateway-upstream.conf").write_text(upstream)
    return workdir / "nginx.conf"


def start_nginx(workdir: Path, config: Path) -> subprocess.Popen[bytes]:
    """nginx in the foreground on `config`, once `nginx -t` accepts it."""
    prefix = ["nginx", "-p", str(workdir), "-c", str(config)]
    check = subprocess.run(
        [*prefix, "-t", "-g", f"pid {workdir}/check.pid;"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    return subprocess.Popen(
        [*prefix, "-g", f"daemon off; pid {workdir}/nginx.pid;"],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "nginx.log").open("wb"),
    )


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    if shutil.which("nginx") is None:
        missing("nginx is not installed (apt-get install nginx)")
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
        process.wait(10)


async def test_nginx_spreads_websockets_and_streams_sse_unbuffered(
    image: str, containers: list[Container], nginx: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    redis_url = require_redis()
    async with postgres_database("gw_proxy") as database_url:
        replicas = start_replicas(replicas_env(database_url, redis_url), containers)
        for replica in replicas:
            await replica.wait_ready()

        port = free_port()
        nginx.append(start_nginx(tmp_path, nginx_config(tmp_path, port, replicas)))
        proxy = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        async with httpx.AsyncClient(timeout=5) as http:
            while True:
                try:
                    if (await http.get(f"http://{proxy}/readyz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, (tmp_path / "nginx.log").read_text()
                await asyncio.sleep(0.1)

        # Held WebSockets go to the replica with the fewest: both get some.
        before = [replica.logs().count(ACCEPTED) for replica in replicas]
        clients = [await Client.connect(f"ws://{proxy}/v1/ws", token("alice")) for _ in range(4)]
        try:
            accepted = [r.logs().count(ACCEPTED) - n for r, n in zip(replicas, before, strict=True)]
            assert sum(accepted) == 4 and min(accepted) >= 1, accepted

            # An SSE feed through the proxy, opened on an empty thread: its `subscribed`
            # message arrives at once (a buffering proxy would hold it), and each event of the
            # run as it is written, the first delta while the run has most of its text to go.
            starter = clients[0]
            thread_id = (await starter.request("thread.create"))["thread_id"]
            headers = {"Authorization": f"Bearer {token('alice')}"}
            deltas_seen_directly: int | None = None
            events: list[str] = []
            async with (
                httpx.AsyncClient(timeout=30) as http,
                http.stream(
                    "GET", f"http://{proxy}/v1/threads/{thread_id}/stream", headers=headers
                ) as feed,
            ):
                assert feed.status_code == 200
                lines = feed.aiter_lines()
                async with asyncio.timeout(5):
                    async for line in lines:
                        if line == "event: subscribed":
                            break
                run = await starter.request("run.start", thread_id=thread_id, input=STORY)
                async for line in lines:
                    frame = json.loads(line.removeprefix("data:")) if line[:5] == "data:" else {}
                    if frame.get("type") != "event":
                        continue
                    events.append(frame["event"])
                    if events[-1] == "message.delta" and deltas_seen_directly is None:
                        deltas_seen_directly = sum(
                            e["event"] == "message.delta" for e in starter.events
                        )
                    if events[-1] == "run.completed":
                        break
            await finished(starter, run["run_id"])
            total = sum(e["event"] == "message.delta" for e in starter.events)
            assert events.count("message.delta") == total
            assert deltas_seen_directly is not None and deltas_seen_directly < total / 2, (
                deltas_seen_directly,
                total,
            )
        finally:
            for client in clients:
                await client.close()
        # Containers go before the database they hold connections to.
        for container in containers:
            container.remove()
