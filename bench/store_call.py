"""What one Store call costs on PostgreSQL, beside the same statements on asyncpg alone.

    .venv/bin/python -m bench.store_call [--calls 3000]

One JSON line: CPU and wall microseconds per call, on uvloop, against a fresh database of
BENCH_POSTGRES_URL's server, for

- `write_single`: `Store.write(work, single_statement=True)`, one status swap (autocommit);
- `write_transaction`: `Store.write(work)` of that one statement (`BEGIN`, it, `COMMIT`);
- `write_transaction_5`: the same with five statements;
- `read`: `Store.read` of the run's row;
- `asyncpg_statement`, `asyncpg_transaction`, `asyncpg_transaction_5`: the swap's SQL and
  parameters, exactly as the store sent them, prepared once on a plain asyncpg connection,
  alone and in a transaction: the driver's own share, which no store path goes below.

The difference is the store path's own: the pool's checkout and return, the greenlet that runs
the synchronous work over the async driver, the prepared statement's parameters.
`BENCH_GATEWAY_ROOT` takes `persistence/` from another tree, as the other parts.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from bench.in_process import run_part

WARMUP_CALLS = 300


async def _timed(call: Callable[[], Awaitable[Any]], calls: int) -> dict[str, float]:
    for _ in range(WARMUP_CALLS):
        await call()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        await call()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cpu_us": round(cpu * 1e6 / calls, 1), "wall_us": round(wall * 1e6 / calls, 1)}


async def measure(database_url: str, calls: int) -> dict[str, Any]:
    import asyncpg
    from sqlalchemy import event
    from sqlalchemy.engine import make_url

    from bench.common import running_run_on_new_thread
    from persistence.backends import open_store
    from persistence.run_status import RunStatus
    from persistence.runs import RunRepository
    from persistence.schema import migrate

    store = open_store(database_url)
    figures: dict[str, Any] = {}
    try:
        await migrate(store)
        await running_run_on_new_thread(store, "r1")

        def swap(conn: Any, times: int = 1) -> None:
            for _ in range(times):
                RunRepository.transition_in(
                    conn, "r1", RunStatus.RUNNING, expected=(RunStatus.RUNNING,)
                )

        runs = RunRepository(store)
        figures["write_single"] = await _timed(
            lambda: store.write(swap, single_statement=True), calls
        )
        figures["write_transaction"] = await _timed(lambda: store.write(swap), calls)
        figures["write_transaction_5"] = await _timed(
            lambda: store.write(partial(swap, times=5)), calls
        )
        figures["read"] = await _timed(lambda: runs.get("r1"), calls)
        # The swap exactly as the store sends it: its SQL and its parameters.
        sent: list[tuple[str, Any]] = []

        def observe(_conn: Any, _cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
            sent.append((sql, parameters))

        (engine, *_) = store.statement_engines()
        event.listen(engine, "before_cursor_execute", observe)
        try:
            await store.write(swap, single_statement=True)
        finally:
            event.remove(engine, "before_cursor_execute", observe)
        ((sql, parameters),) = sent
        dsn = make_url(database_url).set(drivername="postgresql")
        plain = await asyncpg.connect(dsn.render_as_string(hide_password=False))
        try:
            statement = await plain.prepare(sql)

            async def alone() -> None:
                await statement.fetch(*parameters)

            async def in_transaction(times: int = 1) -> None:
                async with plain.transaction():
                    for _ in range(times):
                        await statement.fetch(*parameters)

            figures["asyncpg_statement"] = await _timed(alone, calls)
            figures["asyncpg_transaction"] = await _timed(in_transaction, calls)
            figures["asyncpg_transaction_5"] = await _timed(partial(in_transaction, times=5), calls)
        finally:
            await plain.close()
    finally:
        await store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    run_part("store_call", "postgresql", "call", partial(measure, calls=args.calls))


if __name__ == "__main__":
    main()
