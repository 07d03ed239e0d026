"""What opening a connection costs two gateways, measured side by side.

    .venv/bin/python -m bench.idle_pair --other /path/to/tree [--batches 40]

Figure 6i's CPU per connection moves by a fifth from one run to the next on a machine whose
speed changes within the minute, more than most changes to it. Here two gateway processes run
at once on fresh SQLite databases, this checkout's and `--other`'s, and the benchmark opens
connections as figure 6i does (`bench.idle.open_one`: permessage-deflate offered, `hello` with
a real token, `welcome` awaited), `OPENING_AT_ONCE` at a time, the batches alternating between
the two (ABBA), every connection kept open. Each gateway's CPU (user + system) is read around
each of its batches, so both are timed in the same seconds of the machine.

One JSON line: for each tree its CPU per connection (ms, over all its batches) and hello
latency, and `cpu_ratio`, this checkout's CPU per connection over the other's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection

from bench.common import (
    ROOT,
    ServerProcess,
    emit,
    gateway_process,
    issue_token,
    latency_summary,
    process_cpu_seconds,
    raise_fd_limit,
    report_line,
)
from bench.idle import OPENING_AT_ONCE, SETTLE_S, open_one


async def measure(other: Path, batches: int) -> dict[str, Any]:
    trees = {"this_tree": ROOT, "other_tree": other}
    raise_fd_limit(len(trees) * batches * OPENING_AT_ONCE + 1024)
    hello = orjson.dumps(
        {"type": "hello", "protocol": 1, "token": issue_token("alice", ["user"])}
    ).decode()
    cpu_s = dict.fromkeys(trees, 0.0)
    latencies: dict[str, list[float]] = {name: [] for name in trees}
    opened: list[ClientConnection] = []
    with tempfile.TemporaryDirectory(prefix="bench-idle-pair-") as tmp:
        with contextlib.ExitStack() as stack:
            gateways: dict[str, ServerProcess] = {}
            for name, root in trees.items():
                workdir = Path(tmp) / name
                workdir.mkdir()
                gateways[name] = stack.enter_context(
                    gateway_process(workdir, database=f"sqlite:///{workdir / 'gw.db'}", root=root)
                )
            await asyncio.sleep(SETTLE_S)
            try:
                for batch in range(batches):
                    order = list(trees) if batch % 2 == 0 else list(reversed(trees))
                    for name in order:
                        gateway = gateways[name]
                        before = process_cpu_seconds(gateway.pid)
                        for ws, latency, _ in await asyncio.gather(
                            *(open_one(gateway.ws_url, hello) for _ in range(OPENING_AT_ONCE))
                        ):
                            opened.append(ws)
                            latencies[name].append(latency)
                        after = process_cpu_seconds(gateway.pid)
                        if before is None or after is None:
                            raise RuntimeError("no CPU time for the gateway (Linux /proc only)")
                        cpu_s[name] += after - before
            finally:
                await asyncio.gather(
                    *(asyncio.wait_for(ws.close(), 30) for ws in opened), return_exceptions=True
                )
    per_connection = {name: cpu_s[name] * 1000 / len(latencies[name]) for name in trees}
    return {
        "figure": "6i, paired",
        "connections_each": batches * OPENING_AT_ONCE,
        "other_root": str(other),
        **{
            name: {
                "cpu_ms_per_connection": round(per_connection[name], 3),
                "hello_latency": latency_summary(latencies[name]),
            }
            for name in trees
        },
        "cpu_ratio": round(per_connection["this_tree"] / per_connection["other_tree"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="the other source tree")
    parser.add_argument("--batches", type=int, default=40, help="batches per gateway (40)")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.other.resolve(), args.batches))
    emit(report_line("idle_pair", "sqlite", figures))


if __name__ == "__main__":
    main()
