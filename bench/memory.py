"""Figure 6: memory per idle authenticated connection, gateway against a minimal server.

    .venv/bin/python -m bench memory [--connections 2000]
    .venv/bin/python -m bench memory-hello [--hello-connections 1000]

Each server runs as a subprocess (the gateway with `python -m gateway serve`; the minimal
server is `bench/broadcast_server.py`, which answers the first frame with a fixed `welcome`).
For each: open and close 20 connections (first-use allocations: imports on the WebSocket path,
the token verifier), wait, read the process's resident set size (VmRSS in /proc/PID/status),
open `--connections` connections that each send `hello` and receive `welcome` (for the gateway a
real JWT, so each is authenticated), wait for the server to settle, read VmRSS again. The
figure is the RSS growth divided by the number of connections. The soft open-files limit is
raised first (the servers inherit it): 2,000 connections need 2,000 sockets on each side.

`memory-hello` is the absolute figure: RSS growth per idle connection after `hello` at 1,000
connections, target <= 37 KiB. Beside the gateway and the minimal server (uvicorn's default
WebSocket protocol) it measures the minimal server on uvicorn's `websockets-sansio` protocol,
the one the gateway's derives from: what a raw sans-I/O connection costs before any gateway
state.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from bench.common import (
    Backend,
    ServerProcess,
    clients,
    fresh_database,
    gateway_process,
    raise_fd_limit,
    rss_kib,
    server_process,
)

TARGET_RATIO = 1.5
TARGET_HELLO_KIB = 37.0
SETTLE_S = 2.0


# Opens `count` connections to a server's URL, each past its first exchange, and closes them on
# the way out (`bench.common.clients`: `hello` -> `welcome` on the native protocol).
OpenClients = Callable[[str, int], AbstractAsyncContextManager[Any]]


async def per_connection_kib(
    server: ServerProcess, count: int, open_clients: OpenClients = clients, path: str | None = None
) -> dict[str, Any]:
    """RSS growth of `server` per connection held open by `open_clients` (on `path` instead of
    the server's WebSocket path when given), after a warm-up of 20 that are closed again."""
    url = server.ws_url if path is None else f"ws://127.0.0.1:{server.port}{path}"
    async with open_clients(url, 20):
        pass
    await asyncio.sleep(SETTLE_S)
    before = rss_kib(server.pid)
    async with open_clients(url, count):
        await asyncio.sleep(SETTLE_S)
        after = rss_kib(server.pid)
    return {
        "rss_before_kib": before,
        "rss_after_kib": after,
        "kib_per_connection": round((after - before) / count, 2),
    }


async def measure(count: int, backend: Backend, *, sansio_baseline: bool = False) -> dict:
    limit = raise_fd_limit(2 * count + 512)
    if limit < count + 64:
        raise RuntimeError(f"the open-files limit ({limit}) is too low for {count} connections")
    figures: dict[str, Any] = {"connections": count, "fd_soft_limit": limit}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        workdir = Path(tmp)
        frames = workdir / "frames.jsonl"
        frames.write_text("")
        minimal_cmd = [
            sys.executable,
            str(Path(__file__).with_name("broadcast_server.py")),
            str(frames),
        ]
        with server_process(minimal_cmd, workdir / "minimal.log", {}) as minimal:
            figures["minimal_server"] = await per_connection_kib(minimal, count)
        if sansio_baseline:
            sansio_cmd = [*minimal_cmd, "websockets-sansio"]
            with server_process(sansio_cmd, workdir / "sansio.log", {}) as sansio:
                figures["minimal_server_sansio"] = await per_connection_kib(sansio, count)
        async with fresh_database(backend, workdir) as database:
            with gateway_process(workdir, database=database) as gateway:
                figures["gateway"] = await per_connection_kib(gateway, count)
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--connections", type=int, default=2000, help="idle connections (default 2000)"
    )
    parser.add_argument(
        "--hello-connections",
        type=int,
        default=1000,
        help="memory-hello idle connections (default 1000)",
    )


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    figures = await measure(args.connections, backend)
    ratio = (
        figures["gateway"]["kib_per_connection"] / figures["minimal_server"]["kib_per_connection"]
    )
    return {
        "figure": 6,
        **figures,
        "ratio_gateway_over_minimal": round(ratio, 3),
        "target": f"<= {TARGET_RATIO}x the minimal server",
        "met": ratio <= TARGET_RATIO,
    }


async def run_hello(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    figures = await measure(args.hello_connections, backend, sansio_baseline=True)
    kib = figures["gateway"]["kib_per_connection"]
    sansio = figures["minimal_server_sansio"]["kib_per_connection"]
    return {
        "figure": "6h",
        **figures,
        "gateway_over_sansio_kib": round(kib - sansio, 2),
        "target": f"<= {TARGET_HELLO_KIB} KiB per connection after hello",
        "met": kib <= TARGET_HELLO_KIB,
    }
