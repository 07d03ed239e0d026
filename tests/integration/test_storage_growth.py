"""A thread's stored bytes grow with what was said, not with its square.

Thirty runs on one thread, each with the same input, through the demo agent (which echoes it):
the bytes stored while runs 21-30 ran are within 1.5x of those stored while runs 1-10 ran. Each
superseded checkpoint goes when a newer one of its run is stored, and a final state keeps the
run's own input, not the thread's history the session already holds.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

from tests.support.client import Client
from tests.support.storage import rows

pytestmark = pytest.mark.both_backends

RUNS = 30
# Plain words: the offline demo model echoes them (`You said: ...`, docs/protocol.md §9).
INPUT = " ".join(f"word{n}" for n in range(400))
STORED_BYTES = """
SELECT
  (SELECT COALESCE(SUM(LENGTH(state)), 0) FROM checkpoints)
  + (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM events)
  + (SELECT COALESCE(SUM(LENGTH(message_data)), 0) FROM agent_messages)
  + (SELECT COALESCE(SUM(LENGTH(input)), 0) FROM runs)
"""


async def stored_bytes(database_url: str) -> int:
    ((total,),) = await rows(database_url, STORED_BYTES)
    return int(total)


async def completed(client: Client, run_id: str) -> dict[str, Any]:
    return await client.wait_for(
        lambda f: f.get("event") == "run.completed" and f.get("run_id") == run_id, timeout=30
    )


async def test_thirty_runs_on_one_thread_grow_linearly(
    gateway_factory: Any, database_url: str
) -> None:
    async with gateway_factory() as gw:
        marks = [await stored_bytes(database_url)]
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        ack = await alice.request("run.start", input=INPUT)
        thread_id = ack["thread_id"]
        await completed(alice, ack["run_id"])
        for n in range(2, RUNS + 1):
            if n in (11, 21):
                marks.append(await stored_bytes(database_url))
            ack = await alice.request("run.input", thread_id=thread_id, input=INPUT)
            assert ack["disposition"] == "started"
            await completed(alice, ack["run_id"])
        await alice.close()
    marks.append(await stored_bytes(database_url))
    first, _, last = (b - a for a, b in pairwise(marks))
    assert first > 0
    assert last <= 1.5 * first, (first, last, marks)
    # Only the last run's final state remains of each run's checkpoints: one row a run.
    assert await rows(database_url, "SELECT COUNT(*), COUNT(DISTINCT run_id) FROM checkpoints") == [
        (RUNS, RUNS)
    ]
