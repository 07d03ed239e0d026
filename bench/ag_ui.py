"""AG-UI beside the native protocol: how late a delta reaches a frontend, and what a connect from
the middle of a long run costs.

    .venv/bin/python -m bench.ag_ui [--rounds 5] [--events 2000] [--backend sqlite]

One gateway subprocess (demo model, `GATEWAY_DEMO_DELAY_MS=5`), driven from Node
(tests/frontends/node/bench_ag_ui.mjs, so `npm ci` there first):

- `delta_*`: for each `message.delta` of a demo story run, the time from its `ts` (when the
  gateway produced it, before it was stored) to the moment the client has it: applied by
  `@ag-ui/client` 1.0.0's HttpAgent (through GatewayAgent, `POST /v1/ag-ui/assistant`), or
  parsed by a `ws` client of the native protocol (`run.start` on `/v1/ws`). Rounds alternate
  the two; `ts` has millisecond resolution, so figures under a millisecond are coarse.
- `connect_*`: a thread holding one finished run of `--events` events (a story's deltas
  repeated, written straight into the database as bench/replay.py does); a GatewayAgent with
  `lastEventId` at the middle of the run calls `connectAgent()`; the time runs to its last
  event applied. Beside it, the same from the start of the thread (cursor 0), and the raw
  response read with httpx (`raw_middle`), without the client's parsing and verification.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import (
    BACKENDS,
    ROOT,
    TENANT,
    Backend,
    fresh_database,
    gateway_process,
    issue_token,
    latency_summary,
    report_line,
    story_events,
)

SCRIPT = ROOT / "tests" / "frontends" / "node" / "bench_ag_ui.mjs"
STORY = "tell me a story"


def node_run(config: dict[str, Any]) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        raise SystemExit("bench.ag_ui needs Node.js (and `npm ci` in tests/frontends/node)")
    done = subprocess.run(
        [node, str(SCRIPT), json.dumps(config)],
        cwd=SCRIPT.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


async def stored_ts(base: str, token: str, thread_id: str) -> dict[int, float]:
    """seq -> `ts` (epoch ms) of the thread's events."""
    out: dict[int, float] = {}
    after = 0
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        while True:
            page = (
                await http.get(
                    f"/v1/threads/{thread_id}/events",
                    params={"after_seq": after, "limit": 1000},
                    headers={"Authorization": f"Bearer {token}"},
                )
            ).json()["events"]
            if not page:
                return out
            for event in page:
                out[event["seq"]] = datetime.fromisoformat(event["ts"]).timestamp() * 1000
            after = page[-1]["seq"]


async def build_long_run(database: str, count: int) -> str:
    """A thread with one finished run of `count` events: the story's deltas, over and over."""
    from persistence.events import NewEvent, append_in
    from persistence.ids import new_id
    from persistence.schema import migrate
    from persistence.store import open_store
    from persistence.threads import ThreadRepository

    story = await story_events()
    deltas = [data["delta"] for type_, data in story if type_ == "message.delta"]
    store = open_store(database)
    try:
        await migrate(store)
        thread = await ThreadRepository(store).create(tenant=TENANT, owner="alice")
        run_id, message_id = new_id("r"), new_id("m")
        ts = "2026-01-01T00:00:00.000Z"
        body: list[tuple[str, dict[str, Any]]] = [
            ("run.started", {"input": STORY, "agent": "assistant"}),
            ("message.started", {"message_id": message_id, "agent": "assistant"}),
        ]
        body += [
            ("message.delta", {"message_id": message_id, "delta": deltas[i % len(deltas)]})
            for i in range(count - 4)
        ]
        body += [
            ("message.completed", {"message_id": message_id, "text": ""}),
            ("run.completed", {"final_output": ""}),
        ]
        events = [
            NewEvent(thread.thread_id, run_id, type_, ts, orjson.dumps(data).decode())
            for type_, data in body
        ]
        for start in range(0, len(events), 1000):
            await store.write(partial(append_in, batch=events[start : start + 1000]))
    finally:
        await store.close()
    return thread.thread_id


async def raw_connect(base: str, token: str, thread_id: str, cursor: int) -> float:
    body = {"threadId": thread_id, "runId": "bench", "messages": [], "protocolVersion": "1.0"}
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": str(cursor)}
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        begin = time.perf_counter()
        response = await http.post("/v1/ag-ui/assistant/connect", json=body, headers=headers)
        elapsed = time.perf_counter() - begin
    assert response.status_code == 200 and "RUN_FINISHED" in response.text, response.text[:300]
    return elapsed


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    token = issue_token("alice", ["user"])
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        async with fresh_database(backend, workdir) as database:
            thread_id = await build_long_run(database, args.events)
            with gateway_process(workdir, database=database, demo_delay_ms=5) as gateway:
                base = f"http://127.0.0.1:{gateway.port}"
                url = f"{base}/v1/ag-ui/assistant"
                timed = node_run(
                    {
                        "scenario": "latency",
                        "url": url,
                        "wsUrl": gateway.ws_url,
                        "token": token,
                        "input": STORY,
                        "rounds": args.rounds,
                    }
                )
                lags: dict[str, list[float]] = {"agui": [], "native": []}
                for kind, rounds in timed.items():
                    for round_ in rounds:
                        ts = await stored_ts(base, token, round_["threadId"])
                        lags[kind] += [(at - ts[seq]) / 1000 for seq, at in round_["seen"]]
                cursor = args.events // 2
                connects = node_run(
                    {
                        "scenario": "connect",
                        "url": url,
                        "token": token,
                        "threadId": thread_id,
                        "cursor": cursor,
                        "rounds": args.rounds,
                    }
                )
                raw = [
                    await raw_connect(base, token, thread_id, cursor) for _ in range(args.rounds)
                ]
    figures = {
        "delta_agui": latency_summary(lags["agui"]),
        "delta_native": latency_summary(lags["native"]),
        "connect_events": args.events,
        "connect_cursor": cursor,
        "connect_middle": latency_summary([t / 1000 for t in connects["times"]["middle"]]),
        "connect_start": latency_summary([t / 1000 for t in connects["times"]["start"]]),
        "raw_middle": latency_summary(raw),
    }
    return report_line("ag-ui", backend, figures, rounds=args.rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args, args.backend))))


if __name__ == "__main__":
    main()
