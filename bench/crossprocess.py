"""Cross-process delivery: events written by gateway A, read by a subscriber on gateway B.

Two gateway subprocesses on one fresh database. A client on A runs story runs on one thread;
a subscriber on B watches that thread. For every event, the lag is its arrival at B's client
minus its arrival at A's client (A's own subscriber gets it at once, from A's commit), measured
twice in the same run: with the default `memory://` bus (B finds the events by polling the log
heads, `GATEWAY_LOG_WATCH_INTERVAL_S` = 0.5 s) and with Redis as the bus
(`GATEWAY_BUS_URL`, the machine's Redis at BENCH_REDIS_URL, default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from bench.common import (
    STORY_INPUT,
    Backend,
    BenchClient,
    fresh_database,
    gateway_process,
    issue_token,
    latency_summary,
)

REDIS_URL_ENV = "BENCH_REDIS_URL"
TARGET_P99_MS = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--crossprocess-runs", type=int, default=20, help="crossprocess story runs (20)"
    )


async def lags(a_url: str, b_url: str, runs: int) -> list[float]:
    """Every event's arrival at B's subscriber minus its arrival at A's, over `runs` runs."""
    token = issue_token("alice", ["user"])
    starter = await BenchClient.connect(a_url, token)
    watcher = await BenchClient.connect(b_url, token)
    try:
        _, _, ack = await starter.request("run.start", input=STORY_INPUT)
        thread_id = ack["thread_id"]
        await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        await starter.wait_event("run.completed", ack["run_id"])
        await watcher.wait_event("run.completed", ack["run_id"])  # warm-up run
        seconds: list[float] = []
        for _ in range(runs):
            since_a, since_b = starter.mark(), watcher.mark()
            _, _, ack = await starter.request("run.input", thread_id=thread_id, input=STORY_INPUT)
            run_id = ack["run_id"]
            await starter.wait_event("run.completed", run_id, since_a)
            await watcher.wait_event("run.completed", run_id, since_b)
            at_a = {f["seq"]: t for t, f in starter.run_events(run_id, since_a)}
            at_b = {f["seq"]: t for t, f in watcher.run_events(run_id, since_b)}
            seconds.extend(at_b[seq] - at_a[seq] for seq in at_a if seq in at_b)
        return seconds
    finally:
        await starter.close()
        await watcher.close()


async def measure_bus(backend: Backend, runs: int, bus: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-crossprocess-") as tmp:
        workdir = Path(tmp)
        async with fresh_database(backend, workdir) as database:
            env = {**bus, "GATEWAY_LOG_WATCH_INTERVAL_S": "0.5"}
            with (
                gateway_process(
                    workdir, database=database, env={**env, "GATEWAY_INSTANCE_ID": "a"}, name="a"
                ) as a,
                gateway_process(
                    workdir, database=database, env={**env, "GATEWAY_INSTANCE_ID": "b"}, name="b"
                ) as b,
            ):
                return latency_summary(await lags(a.ws_url, b.ws_url, runs))


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    redis_url = os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/0")
    runs = args.crossprocess_runs
    polling = await measure_bus(backend, runs, {"GATEWAY_BUS_URL": "memory://"})
    redis = await measure_bus(
        backend,
        runs,
        {"GATEWAY_BUS_URL": redis_url, "GATEWAY_BUS_PREFIX": f"bench-{secrets.token_hex(4)}"},
    )
    return {
        "figure": "cross-process",
        "runs": runs,
        "lag_b_minus_a_polling": polling,
        "lag_b_minus_a_redis": redis,
        "target": f"with Redis, p99 of B's lag behind A <= {TARGET_P99_MS} ms",
        "met": redis["p99_ms"] <= TARGET_P99_MS,
    }
