"""SSE feeds whose clients never read, on a thread of large events: each may cost the server
only the bound docs/operations.md gives per slow client while it is open; one that stays behind
is ended (`event: end`, 4009) and its socket and connection slot are released; one whose token
expires is ended at `exp` whether or not its client reads; and a gateway asked to stop with
feeds open ends them at once with `event: end` (1012) and exits as fast as with WebSockets
only, without an error in its log."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.auth.access import TokenVerifier
from gateway.server.connection_limits import CLOSE_TIMEOUT_S
from tests.support.gateway import TEST_SECRET, GatewayProcess, database_url, spawn_gateway
from tests.support.hostile import (
    LARGE_EVENTS,
    close_all,
    established_to,
    eventually,
    memory_kib,
    never_reading_feed,
    never_reading_websocket,
    read_all,
    reset_peak_memory,
    thread_of_large_events,
)

FEEDS = 20
# docs/operations.md "Slow clients and limits": about 2 MB per client that stops reading.
PER_FEED_KIB = 2 * 1024 + 512
TOKENS = TokenVerifier(TEST_SECRET)
ENDED_LINE = "ending a feed whose client stopped reading"


@pytest.fixture(scope="module")
def large_thread(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A database holding one thread of LARGE_THREAD_BYTES of large events: (file, id)."""
    workdir = tmp_path_factory.mktemp("large-thread")
    gateway = spawn_gateway(workdir, env=LARGE_EVENTS)
    try:
        thread_id = asyncio.run(thread_of_large_events(gateway))
    finally:
        gateway.terminate()
    yield workdir / "gateway.db", thread_id


def on_thread(database: Path, **env: str) -> dict[str, str]:
    return {**LARGE_EVENTS, "GATEWAY_DATABASE_URL": database_url(database), **env}


def feed_path(thread_id: str) -> str:
    return f"/v1/threads/{thread_id}/stream"


async def test_feeds_that_never_read_cost_little_and_are_ended(
    spawn: Callable[..., GatewayProcess], large_thread: tuple[Path, str]
) -> None:
    database, thread_id = large_thread
    gateway = spawn(
        env=on_thread(
            database, GATEWAY_SEND_TIMEOUT_S="3", GATEWAY_MAX_CONNECTIONS_PER_USER=str(FEEDS)
        )
    )
    path = feed_path(thread_id)
    # One reader replays the whole thread first: what a normal replay costs is baseline.
    reader_token = TOKENS.issue("carol", "acme", ["viewer"])
    await replay_whole_thread(gateway.port, path, reader_token)
    pid = gateway.process.pid
    before = memory_kib(pid)
    peak_reset = reset_peak_memory(pid)
    token = TOKENS.issue("mallory", "acme", ["viewer"])
    sockets = [never_reading_feed(gateway.port, path, token) for _ in range(FEEDS)]
    try:
        ended = await eventually(lambda: gateway.log().count(ENDED_LINE) >= FEEDS, 40)
        ended_at = time.monotonic()
        gone = await eventually(lambda: established_to(gateway.port) == 0, 30, step=0.2)
        gone_after = time.monotonic() - ended_at
        after = memory_kib(pid)
        # Their slots are free: the user may open as many feeds again.
        again = [never_reading_feed(gateway.port, path, token) for _ in range(FEEDS)]
        answers = [read_head(sock) for sock in again]
        close_all(again)
    finally:
        close_all(sockets)
    baseline = before["VmRSS"] if peak_reset else before["VmHWM"]
    peak_growth = after["VmHWM"] - baseline
    print(
        f"{FEEDS} never-reading feeds: peak +{peak_growth} KiB ({peak_growth // FEEDS} KiB each); "
        f"sockets gone {gone_after:.1f} s after the last was ended"
    )
    assert peak_growth <= FEEDS * PER_FEED_KIB, (before, after)
    assert ended, f"only {gateway.log().count(ENDED_LINE)} of {FEEDS} feeds ended"
    assert gone, f"{established_to(gateway.port)} connections still open"
    assert gone_after <= CLOSE_TIMEOUT_S + 5
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers), answers


async def replay_whole_thread(port: int, path: str, token: str) -> None:
    """Read the feed up to the thread's newest event (its `subscribed` names it)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        headers = {"Authorization": f"Bearer {token}"}
        async with http.stream("GET", path, headers=headers) as replay:
            head: bytes | None = None
            tail = b""
            async for chunk in replay.aiter_bytes():
                tail = (tail + chunk)[-100_000:]
                if head is None and b"event: subscribed" in tail:
                    data = tail.split(b"event: subscribed\n", 1)[1].split(b"data: ", 1)[1]
                    head = b"id: %d\n" % json.loads(data.split(b"\n", 1)[0])["head_seq"]
                if head is not None and head in tail:
                    return


def read_head(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return head


async def test_a_feed_that_falls_behind_is_told_how_to_resume(
    spawn: Callable[..., GatewayProcess], large_thread: tuple[Path, str]
) -> None:
    """A client that reads late finds the feed's last word after the events it had been sent:
    `event: end` with the WebSocket's 4009, and the end of the response."""
    database, thread_id = large_thread
    gateway = spawn(env=on_thread(database, GATEWAY_SEND_TIMEOUT_S="1"))
    token = TOKENS.issue("mallory", "acme", ["viewer"])
    sock = never_reading_feed(gateway.port, feed_path(thread_id), token)
    try:
        assert await eventually(lambda: ENDED_LINE in gateway.log(), 20)
        received = read_all(sock, 15)
    finally:
        sock.close()
    assert b"event: subscribed" in received
    tail = received[-1000:]
    assert b"event: end\r\n" in tail or b"event: end\n" in tail, tail
    end = json.loads(tail.split(b"event: end\n")[-1].split(b"data: ", 1)[1].split(b"\n")[0])
    assert end["type"] == "end" and end["code"] == 4009, end
    # The chunked body is complete: the client can tell an end from a cut.
    assert tail.endswith(b"0\r\n\r\n"), tail[-50:]


async def test_a_never_reading_feed_ends_at_its_tokens_expiry(
    spawn: Callable[..., GatewayProcess], large_thread: tuple[Path, str]
) -> None:
    """Ended at `exp` (plus leeway) although its writer waits for the client, and no longer
    counted against its user's connections."""
    database, thread_id = large_thread
    gateway = spawn(
        env=on_thread(
            database,
            GATEWAY_SEND_TIMEOUT_S="300",
            GATEWAY_JWT_LEEWAY_S="0",
            GATEWAY_MAX_CONNECTIONS_PER_USER="1",
        )
    )
    path = feed_path(thread_id)
    expiring = TOKENS.issue("mallory", "acme", ["viewer"], ttl_s=3)
    opened = time.monotonic()
    sock = never_reading_feed(gateway.port, path, expiring)
    try:
        closed = await eventually(lambda: established_to(gateway.port) == 0, 30, step=0.2)
        closed_after = time.monotonic() - opened
        fresh = TOKENS.issue("mallory", "acme", ["viewer"])
        again = never_reading_feed(gateway.port, path, fresh)
        answer = read_head(again)
        again.close()
    finally:
        sock.close()
    print(f"never-reading feed closed {closed_after:.1f} s after opening with a 3 s token")
    assert closed, "the feed outlived its token"
    # Its token's 3 s, plus the close timeout for a client that takes nothing.
    assert closed_after <= 3 + CLOSE_TIMEOUT_S + 3
    assert answer.startswith(b"HTTP/1.1 200"), answer


async def stop_and_time(gateway: GatewayProcess) -> float:
    started = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)
    while gateway.process.poll() is None:
        await asyncio.sleep(0.05)
        assert time.monotonic() - started < 30, "the gateway did not stop"
    return time.monotonic() - started


async def test_a_stop_with_feeds_open_is_prompt_and_quiet(
    tmp_path: Path, large_thread: tuple[Path, str]
) -> None:
    database, thread_id = large_thread
    path = feed_path(thread_id)
    token = TOKENS.issue("carol", "acme", ["viewer"])
    # With WebSockets only: the figure to match.
    sockets_only = spawn_gateway(tmp_path, env=on_thread(database))
    hello = json.dumps({"type": "hello", "protocol": 1, "token": token})
    socket_clients = [never_reading_websocket(sockets_only.port, [hello]) for _ in range(3)]
    try:
        sockets_s = await stop_and_time(sockets_only)
    finally:
        close_all(socket_clients)
    gateway = spawn_gateway(tmp_path, env=on_thread(database))
    stalled = [never_reading_feed(gateway.port, path, token) for _ in range(3)]
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{gateway.port}", timeout=30
        ) as http:
            async with http.stream(
                "GET", f"{path}?after_seq=999999999", headers={"Authorization": f"Bearer {token}"}
            ) as reading:
                assert reading.status_code == 200
                body = reading.aiter_bytes()
                first = await anext(body)
                assert b"event: subscribed" in first
                stopping = asyncio.create_task(stop_and_time(gateway))
                rest = b""
                async for chunk in body:
                    rest += chunk
                feeds_s = await stopping
    finally:
        close_all(stalled)
    log = gateway.log()
    print(f"stopped in {feeds_s:.2f} s with feeds open, {sockets_s:.2f} s with WebSockets only")
    assert b"event: end" in rest, rest
    end = json.loads(rest.split(b"event: end\n")[1].split(b"data: ", 1)[1].split(b"\n")[0])
    assert end["code"] == 1012, end
    assert feeds_s <= sockets_s + 2, (feeds_s, sockets_s)
    assert "ERROR" not in log and "Traceback" not in log, log
