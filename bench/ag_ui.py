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
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    BACKENDS,
    Backend,
    fresh_database,
    gateway_process,
    issue_token,
    latency_summary,
    report_line,
)
from bench.frontends import STORY, build_long_run, lags_from_ts, node_run

SCRIPT = "bench_ag_ui.mjs"


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
                    SCRIPT,
                    {
                        "scenario": "latency",
                        "url": url,
                        "wsUrl": gateway.ws_url,
                        "token": token,
                        "input": STORY,
                        "rounds": args.rounds,
                    },
                )
                lags = {
                    kind: await lags_from_ts(base, token, rounds) for kind, rounds in timed.items()
                }
                cursor = args.events // 2
                connects = node_run(
                    SCRIPT,
                    {
                        "scenario": "connect",
                        "url": url,
                        "token": token,
                        "threadId": thread_id,
                        "cursor": cursor,
                        "rounds": args.rounds,
                    },
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
