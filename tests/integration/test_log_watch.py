"""Two gateway processes on one database: a subscriber on one sees, live, what the other writes
(the log watch), and a thread both write to reaches it dense and exactly once."""

from __future__ import annotations

from pathlib import Path

from gateway.auth.access import TokenVerifier
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, spawn_gateway

TOKEN = TokenVerifier(TEST_SECRET)


async def test_a_watcher_on_one_process_follows_runs_written_by_another(
    tmp_path: Path, processes
) -> None:
    env = {"GATEWAY_LOG_WATCH_INTERVAL_S": "0.1", "GATEWAY_DEMO_DELAY_MS": "5"}
    a = spawn_gateway(tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-a"})
    b = spawn_gateway(tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-b"})
    processes.extend([a, b])
    token = TOKEN.issue("alice", "acme", ["user"])
    writer_a = await Client.connect(a.ws_url, token)
    writer_b = await Client.connect(b.ws_url, token)
    watcher = await Client.connect(b.ws_url, token)
    try:
        first = await writer_a.request("run.start", input="tell me a story")
        thread_id = first["thread_id"]
        await watcher.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        await watcher.wait_event("run.completed", timeout=60)
        # The same thread, now continued on B, then on A again: both processes' writes.
        await writer_b.request("run.start", thread_id=thread_id, input="hello there")
        await watcher.wait_for(
            lambda _frame: (
                [e["event"] for e in watcher.events_of(thread_id)].count("run.completed") == 2
            ),
            timeout=60,
        )
        await writer_a.request("run.start", thread_id=thread_id, input="tell me a story")
        await watcher.wait_for(
            lambda _frame: (
                [e["event"] for e in watcher.events_of(thread_id)].count("run.completed") == 3
            ),
            timeout=60,
        )
        events = watcher.events_of(thread_id)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert len({e["run_id"] for e in events if e["event"] == "run.started"}) == 3
    finally:
        for client in (writer_a, writer_b, watcher):
            await client.close()
