"""What the frontend benchmarks (bench/ag_ui.py, bench/ai_sdk.py) share: their Node side, the
stored events' timestamps, and a long finished run written straight into the database.

The Node scripts live beside the frontend tests (tests/frontends/node) because they import the
exact packages that package-lock.json pins there; `npm ci` in that folder first.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime
from functools import partial
from typing import Any

import httpx
import orjson

from bench.common import ROOT, TENANT, story_events

NODE_DIR = ROOT / "tests" / "frontends" / "node"
STORY = "tell me a story"


def node_run(script: str, config: dict[str, Any]) -> dict[str, Any]:
    """Run `tests/frontends/node/<script>` with `config` as its argument; its last stdout line,
    parsed."""
    node = shutil.which("node")
    if node is None:
        raise SystemExit(f"{script} needs Node.js (and `npm ci` in {NODE_DIR})")
    done = subprocess.run(
        [node, str(NODE_DIR / script), json.dumps(config)],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


async def stored_events(base: str, token: str, thread_id: str) -> dict[int, tuple[float, str]]:
    """seq -> (`ts` in epoch ms, event type) of the thread's events, read over the HTTP API."""
    out: dict[int, tuple[float, str]] = {}
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
                ts = datetime.fromisoformat(event["ts"]).timestamp() * 1000
                out[event["seq"]] = (ts, event["event"])
            after = page[-1]["seq"]


async def lags_from_ts(
    base: str, token: str, rounds: list[dict[str, Any]], event_type: str = "message.delta"
) -> list[float]:
    """For each round `{threadId, seen: [[seq, epoch ms], ...]}` from a Node script: the time
    (s) from each seen event's stored `ts` to when the client had it. Every seen seq must be an
    `event_type` event: a client that attributed a time to the wrong event fails loudly here."""
    lags: list[float] = []
    for round_ in rounds:
        stored = await stored_events(base, token, round_["threadId"])
        for seq, at in round_["seen"]:
            ts, type_ = stored[seq]
            if type_ != event_type:
                raise AssertionError(f"seq {seq} is {type_}, not {event_type}")
            lags.append((at - ts) / 1000)
    return lags


async def build_long_run(database: str, count: int) -> str:
    """A thread with one finished run of `count` events: the story's deltas, over and over."""
    from persistence.backends import open_store
    from persistence.events import NewEvent, append_in
    from persistence.ids import new_id
    from persistence.schema import migrate
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
