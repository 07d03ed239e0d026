"""Idle connections held by one gateway process, opened as browsers open them.

    .venv/bin/python -m bench idle [--idle-connections 10000]

One gateway process (`serve`, the connection bound off) on a fresh database. The benchmark
opens `--idle-connections` WebSocket connections, `OPENING_AT_ONCE` at a time, each offering
permessage-deflate as every browser does (whatever `--compression` says), and on each sends
`hello` with a real token and waits for `welcome`. Every connection's hello latency (`hello`
sent to `welcome` received) is kept, measured while the others are still connecting, and so is
the gateway's CPU time over the opening (a connection's share of it). Once all are open and the
process has settled, its resident set size (VmRSS, absolute) is read.

Targets: 10,000 connections within 400 MiB of RSS, hello p99 <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import websockets
from websockets.asyncio.client import ClientConnection

from bench.common import (
    TIMEOUT_S,
    Backend,
    fresh_database,
    gateway_process,
    issue_token,
    latency_summary,
    process_cpu_seconds,
    raise_fd_limit,
    rss_kib,
)

TARGET_RSS_MIB = 400.0
TARGET_HELLO_P99_MS = 50.0
OPENING_AT_ONCE = 100
SETTLE_S = 2.0


async def open_one(url: str, hello: str) -> tuple[ClientConnection, float, bool]:
    """A connection past `welcome`: the connection, its hello latency, whether it negotiated
    permessage-deflate."""
    ws = await websockets.connect(
        url, max_size=None, compression="deflate", ping_interval=None, open_timeout=TIMEOUT_S
    )
    sent = time.perf_counter()
    await ws.send(hello)
    reply = await asyncio.wait_for(ws.recv(), TIMEOUT_S)
    latency = time.perf_counter() - sent
    if orjson.loads(reply).get("type") != "welcome":
        raise RuntimeError(f"no welcome: {reply!r}")
    return ws, latency, bool(ws.protocol.extensions)


async def measure(count: int, backend: Backend) -> dict[str, Any]:
    limit = raise_fd_limit(count + 1024)
    if limit < count + 64:
        raise RuntimeError(f"the open-files limit ({limit}) is too low for {count} connections")
    hello = orjson.dumps(
        {"type": "hello", "protocol": 1, "token": issue_token("alice", ["user"])}
    ).decode()
    opened: list[ClientConnection] = []
    latencies: list[float] = []
    compressed = 0
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        workdir = Path(tmp)
        async with fresh_database(backend, workdir) as database:
            with gateway_process(workdir, database=database) as gateway:
                await asyncio.sleep(SETTLE_S)
                rss_before = rss_kib(gateway.pid)
                cpu_before = process_cpu_seconds(gateway.pid)
                begin = time.perf_counter()
                try:
                    for start in range(0, count, OPENING_AT_ONCE):
                        batch = min(OPENING_AT_ONCE, count - start)
                        for ws, latency, deflate in await asyncio.gather(
                            *(open_one(gateway.ws_url, hello) for _ in range(batch))
                        ):
                            opened.append(ws)
                            latencies.append(latency)
                            compressed += deflate
                    opening_s = time.perf_counter() - begin
                    cpu_after = process_cpu_seconds(gateway.pid)
                    await asyncio.sleep(SETTLE_S)
                    rss_after = rss_kib(gateway.pid)
                finally:
                    await asyncio.gather(
                        *(asyncio.wait_for(ws.close(), 30) for ws in opened),
                        return_exceptions=True,
                    )
    hello_latency = latency_summary(latencies)
    rss_mib = rss_after / 1024
    return {
        "figure": "6i",
        "connections": count,
        "deflate_negotiated": compressed,
        "opening_s": round(opening_s, 1),
        # The gateway's CPU (user + system) while they opened, a connection's share of it.
        "gateway_cpu_ms_per_connection": (
            None
            if cpu_before is None or cpu_after is None
            else round((cpu_after - cpu_before) * 1000 / count, 3)
        ),
        "hello_latency": hello_latency,
        "rss_before_mib": round(rss_before / 1024, 1),
        "rss_after_mib": round(rss_mib, 1),
        "kib_per_connection": round((rss_after - rss_before) / count, 2),
        "target": f"RSS <= {TARGET_RSS_MIB} MiB, hello p99 <= {TARGET_HELLO_P99_MS} ms",
        "met": rss_mib <= TARGET_RSS_MIB and hello_latency["p99_ms"] <= TARGET_HELLO_P99_MS,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--idle-connections",
        type=int,
        default=10_000,
        help="idle: connections held open (default 10000)",
    )


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    return await measure(args.idle_connections, backend)
