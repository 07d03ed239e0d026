"""The event log's batch under figure 7's load: one streamed event on each of many threads.

    .venv/bin/python -m bench.fenced_batch [--threads 44] [--batches 2000] [--backend postgresql]

One JSON line. Each batch is what the event log's writer commits while 200 runs stream at
50 deltas/s (figure 7 on SQLite: 48,400 deltas in about 1,100 commits, 44 a commit): one
`message.delta` on each of `--threads` threads, each run under its lease, stored with
`Store.append` (the fencing read of the leases, the heads' bump, the rows, one transaction) on
a fresh database. Reported: the process's CPU and the wall time per batch and per event, and
the share of each statement (SQL's first words) in the batch's time, timed around the driver's
call (`persistence/prepared.py`). No SDK, no socket, no subscriber: what storing costs.

`BENCH_GATEWAY_ROOT` takes `gateway/` and `persistence/` from another tree, as the other parts.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from functools import partial
from typing import Any

from bench.in_process import run_part

DELTA = '{"message_id":"m_92e9a48bcd76a98d7e7ffd04","delta":"one word of a story "}'
TS = "2026-01-01T00:00:00.000Z"
WARMUP_BATCHES = 100


async def measure(threads: int, batches: int, database_url: str) -> dict[str, Any]:
    import persistence.prepared as prepared
    from bench.common import running_run_on_new_thread
    from persistence.backends import open_store
    from persistence.events import NewEvent
    from persistence.leases import LeaseRepository
    from persistence.schema import migrate

    spent: defaultdict[str, float] = defaultdict(float)
    run = prepared._run

    def timed_run(conn: Any, sql: str, params: Any, *, many: bool) -> Any:
        began = time.perf_counter()
        try:
            return run(conn, sql, params, many=many)
        finally:
            spent[" ".join(sql.split()[:3])] += time.perf_counter() - began

    store = open_store(database_url)
    try:
        await migrate(store)
        events: list[Any] = []
        for n in range(threads):
            thread_id = await running_run_on_new_thread(store, f"r{n}")
            lease = await LeaseRepository(store).acquire(f"r{n}", "bench", ttl_s=3600)
            events.append(NewEvent(thread_id, f"r{n}", "message.delta", TS, DELTA, lease))
        for _ in range(WARMUP_BATCHES):
            await store.append(events)
        prepared._run = timed_run  # type: ignore[assignment]
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(batches):
            records, lost = await store.append(events)
            if len(records) != threads or lost:
                raise RuntimeError("a batch was not stored whole")
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        prepared._run = run
        await store.close()
    timed = sum(spent.values())
    return {
        "threads": threads,
        "batches": batches,
        "cpu_us_per_batch": round(cpu * 1e6 / batches, 1),
        "cpu_us_per_event": round(cpu * 1e6 / batches / threads, 2),
        "wall_us_per_batch": round(wall * 1e6 / batches, 1),
        "statement_us_per_batch": {
            sql: round(seconds * 1e6 / batches, 1)
            for sql, seconds in sorted(spent.items(), key=lambda item: -item[1])
        },
        "statements_share_of_wall": round(timed / wall, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=44)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    args = parser.parse_args()
    run_part("fenced_batch", args.backend, "batch", partial(measure, args.threads, args.batches))


if __name__ == "__main__":
    main()
