"""Takeover: how soon a run goes on in another gateway when the one streaming it stops.

Gateway B, and gateway A started afresh for every try, on one fresh database with Redis as the
bus. A client on A starts the demo model's order-status run (five tool turns, the model at
`--takeover-delay-ms` per delta) and a client on B watches it; once its first tool has run, A
is stopped:

- `sigterm`: a graceful stop. A suspends the run at its next turn boundary, releases its leases
  and hands the run over on the bus; B continues it (`run.resumed`).
- `sigkill`: a crash. Nothing tells B; its lease scan (every half lease TTL) takes the run over
  once A's lease has expired (`run.recovered`). The figure therefore follows
  `--takeover-lease-ttl-s` (between 1x and 1.5x it); a process restarted under A's instance id
  would take the run over at once instead.

Each figure is from the signal to the arrival of B's first event of the run at B's watcher
(`run.resumed` / `run.recovered`); every run is then followed to `run.completed`.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    Backend,
    BenchClient,
    fresh_database,
    gateway_process,
    issue_token,
    latency_summary,
)
from bench.crossprocess import REDIS_URL_ENV

STATUS_INPUT = "status of orders 11, 12, 13, 14 and 15"
TAKEN_OVER = {"run.resumed", "run.recovered"}
# After SIGKILL: the lease runs out (1x TTL), the next scan finds it (up to 0.5x TTL later),
# then the run is restored and its first event stored and sent.
RESTORE_ALLOWANCE_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--takeover-tries", type=int, default=5, help="takeover: tries each (5)")
    parser.add_argument(
        "--takeover-lease-ttl-s", type=float, default=4.0, help="takeover: lease TTL (4)"
    )
    parser.add_argument(
        "--takeover-delay-ms", type=int, default=15, help="takeover: delay per delta (15)"
    )


async def one_try(
    workdir: Path, database: str, env: dict[str, str], b: BenchClient, how: signal.Signals, n: int
) -> float:
    token = issue_token("alice", ["user"])
    name = f"a{how.name.lower()}{n}"
    with gateway_process(
        workdir, database=database, env={**env, "GATEWAY_INSTANCE_ID": name}, name=name
    ) as a:
        starter = await BenchClient.connect(a.ws_url, token)
        try:
            _, _, ack = await starter.request("run.start", input=STATUS_INPUT)
            run_id = ack["run_id"]
            since = b.mark()
            await b.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
            await b.wait_event("tool.output", run_id, since)
            os.kill(a.pid, how)
            stopped_at = time.perf_counter()
            arrived, _ = await b.wait_for(
                lambda f: (
                    f.get("type") == "event"
                    and f.get("run_id") == run_id
                    and f.get("event") in TAKEN_OVER
                ),
                since,
            )
            await b.wait_event("run.completed", run_id, since)
            return arrived - stopped_at
        finally:
            await starter.close()


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    redis_url = os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/0")
    env = {
        "GATEWAY_BUS_URL": redis_url,
        "GATEWAY_BUS_PREFIX": f"bench-{secrets.token_hex(4)}",
        "GATEWAY_LEASE_TTL_S": str(args.takeover_lease_ttl_s),
    }
    seconds: dict[str, list[float]] = {"sigterm": [], "sigkill": []}
    with tempfile.TemporaryDirectory(prefix="bench-takeover-") as tmp:
        workdir = Path(tmp)
        async with fresh_database(backend, workdir) as database:
            with gateway_process(
                workdir,
                database=database,
                demo_delay_ms=args.takeover_delay_ms,
                env={**env, "GATEWAY_INSTANCE_ID": "b"},
                name="b",
            ) as b_process:
                b = await BenchClient.connect(b_process.ws_url, issue_token("alice", ["user"]))
                try:
                    a_env = {**env, "GATEWAY_DEMO_DELAY_MS": str(args.takeover_delay_ms)}
                    for n in range(args.takeover_tries):
                        for how in (signal.SIGTERM, signal.SIGKILL):
                            taken = await one_try(workdir, database, a_env, b, how, n)
                            seconds[how.name.lower()].append(taken)
                finally:
                    await b.close()
    return {
        "figure": "takeover",
        "tries": args.takeover_tries,
        "lease_ttl_s": args.takeover_lease_ttl_s,
        "after_sigterm": latency_summary(seconds["sigterm"]),
        "after_sigkill": latency_summary(seconds["sigkill"]),
        "target": "after SIGTERM at once (under half the lease TTL); after SIGKILL within "
        f"1.5x the lease TTL + {RESTORE_ALLOWANCE_S} s",
        "met": max(seconds["sigterm"]) < args.takeover_lease_ttl_s / 2
        and max(seconds["sigkill"]) <= 1.5 * args.takeover_lease_ttl_s + RESTORE_ALLOWANCE_S,
    }
