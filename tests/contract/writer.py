"""A second process for the contract suite: appends batches of events through its own Store.

    python -m tests.contract.writer URL BATCHES THREAD_ID [THREAD_ID ...]

Each batch holds one event for every thread named, in the order given (the suite passes the
same threads in opposite orders to two writers). Prints `done N` with the events it stored.
"""

from __future__ import annotations

import asyncio
import sys

from persistence.backends import open_store
from persistence.events import NewEvent


async def main(url: str, batches: int, thread_ids: list[str]) -> int:
    store = open_store(url)
    stored = 0
    try:
        for n in range(batches):
            batch = [
                NewEvent(thread_id, None, "test.event", "2026-01-01T00:00:00.000Z", f'{{"n":{n}}}')
                for thread_id in thread_ids
            ]
            records, _ = await store.append(batch)
            stored += len(records)
    finally:
        await store.close()
    print(f"done {stored}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])))
