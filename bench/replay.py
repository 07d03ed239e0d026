"""Figure 5: replaying a long thread from cursor 0 over one WebSocket.

    .venv/bin/python -m bench replay [--events 10000] [--reps 5]
    .venv/bin/python -m bench replay-plain [--plain-events 6000] [--reps 5]

Before the gateway starts, the benchmark writes a thread of `--events` events straight into a
fresh database of the selected backend (`bench.common.fresh_database`) through the gateway's own
Store (`Store.write` of `events.append_in`):
demo story runs one after another (`run.started`, `message.started`, one `message.delta` per
word, `message.completed`, `run.completed`), cut at exactly `--events`. Then, per repetition, a
fresh connection sends `thread.subscribe` with `after_seq: 0`; the time runs from that send to
the arrival of the last seq. Frames are only collected while timing; afterwards every one is
checked: seq 1..N dense, in order, each event's type and data exactly as stored.

Alternating with the gateway, the same client takes the same frames from the minimal server's
memory (`bench/broadcast_server.py`): `client_ceiling_events_per_s` is the most this client can
receive on this machine, which bounds what any server can show here.

`replay-plain` is the same replay as a user's program sees it: a ~6,000-event thread, read by a
plain `websockets` client (its default options, so whatever compression it negotiates with the
server) that `json.loads` every frame as it arrives and stops at the last seq; the ceiling is
that same client on the minimal server's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import websockets

from bench.common import (
    TENANT,
    TIMEOUT_S,
    Backend,
    connect,
    fresh_database,
    gateway_process,
    issue_token,
    server_process,
    story_events,
)

TARGET_EVENTS_PER_S = 50_000
# replay-plain's: what a user's program with a plain client reads (figure 5p).
TARGET_PLAIN_EVENTS_PER_S = 80_000


async def build_thread(database: str, count: int) -> tuple[str, list[tuple[str, str]]]:
    """A thread with `count` events; returns its id and every (type, data JSON) in order."""
    from persistence.backends import open_store
    from persistence.events import NewEvent, append_in
    from persistence.ids import new_id
    from persistence.schema import migrate
    from persistence.threads import ThreadRepository

    story = await story_events()
    store = open_store(database)
    try:
        await migrate(store)
        thread = await ThreadRepository(store).create(tenant=TENANT, owner="alice")
        stored: list[tuple[str, str]] = []
        batch: list[NewEvent] = []
        ts = "2026-01-01T00:00:00.000Z"
        while len(stored) < count:
            run_id, message_id = new_id("r"), new_id("m")
            for type_, data in story:
                if len(stored) == count:
                    break
                if "message_id" in data:
                    data = {**data, "message_id": message_id}
                text = orjson.dumps(data).decode()
                stored.append((type_, text))
                batch.append(NewEvent(thread.thread_id, run_id, type_, ts, text))
                if len(batch) == 1000:
                    await store.write(partial(append_in, batch=batch))
                    batch = []
        if batch:
            await store.write(partial(append_in, batch=batch))
    finally:
        await store.close()
    return thread.thread_id, stored


async def replay_once(url: str, token: str, thread_id: str, count: int) -> tuple[float, list]:
    ws = await connect(url, token)
    try:
        raws: list[str | bytes] = []
        needle = f'"seq":{count},'
        request = orjson.dumps(
            {"type": "thread.subscribe", "thread_id": thread_id, "after_seq": 0}
        ).decode()
        begin = time.perf_counter()
        await ws.send(request)
        async with asyncio.timeout(TIMEOUT_S):
            while True:
                raw = await ws.recv()
                raws.append(raw)
                if needle in raw:  # type: ignore[operator]
                    break
        return time.perf_counter() - begin, raws
    finally:
        await ws.close()


async def plain_connect(url: str, token: str) -> websockets.ClientConnection:
    """A `websockets` client as a user would open one: default options, then hello."""
    ws = await websockets.connect(url)
    await ws.send(json.dumps({"type": "hello", "protocol": 1, "token": token}))
    welcome = json.loads(await ws.recv())
    if welcome.get("type") != "welcome":
        await ws.close()
        raise RuntimeError(f"no welcome: {welcome}")
    return ws


async def plain_replay_once(
    url: str, token: str, thread_id: str, count: int
) -> tuple[float, list, list[str]]:
    """Replay with the plain client, parsing every frame; returns its time, the frames and
    the extensions the connection negotiated."""
    ws = await plain_connect(url, token)
    try:
        frames: list[dict[str, Any]] = []
        request = json.dumps({"type": "thread.subscribe", "thread_id": thread_id, "after_seq": 0})
        begin = time.perf_counter()
        await ws.send(request)
        async with asyncio.timeout(TIMEOUT_S):
            async for raw in ws:
                frame = json.loads(raw)
                frames.append(frame)
                if frame.get("seq") == count:
                    break
        extensions = [type(e).__name__ for e in ws.protocol.extensions]
        return time.perf_counter() - begin, frames, extensions
    finally:
        await ws.close()


async def plain_from_memory_once(url: str, count: int) -> float:
    ws = await plain_connect(url, "-")
    try:
        begin = time.perf_counter()
        await ws.send('{"type":"go"}')
        async with asyncio.timeout(TIMEOUT_S):
            async for raw in ws:
                if json.loads(raw).get("seq") == count:
                    break
        elapsed = time.perf_counter() - begin
        async with asyncio.timeout(TIMEOUT_S):
            while await ws.recv() != '{"type":"done"}':
                pass
        return elapsed
    finally:
        await ws.close()


def check(raws: list[Any], stored: list[tuple[str, str]], thread_id: str) -> dict[str, Any]:
    frames = [raw if isinstance(raw, dict) else orjson.loads(raw) for raw in raws]
    events = [f for f in frames if f.get("type") == "event"]
    seqs = [f["seq"] for f in events]
    exact = len(events) == len(stored) and all(
        f["thread_id"] == thread_id and f["event"] == type_ and f["data"] == orjson.loads(data)
        for f, (type_, data) in zip(events, stored, strict=False)
    )
    return {
        "events": len(events),
        "dense": seqs == list(range(1, len(stored) + 1)),
        "exact": exact,
    }


async def from_memory_once(url: str, count: int) -> float:
    """The same frames from the minimal server's memory: what this client can take at most."""
    ws = await connect(url, "-")
    try:
        needle = f'"seq":{count},'
        begin = time.perf_counter()
        await ws.send('{"type":"go"}')
        async with asyncio.timeout(TIMEOUT_S):
            while needle not in await ws.recv():  # type: ignore[operator]
                pass
        elapsed = time.perf_counter() - begin
        async with asyncio.timeout(TIMEOUT_S):
            while await ws.recv() != '{"type":"done"}':
                pass
        return elapsed
    finally:
        await ws.close()


async def measure(
    count: int, reps: int, backend: Backend, *, plain: bool = False
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        workdir = Path(tmp)
        async with fresh_database(backend, workdir) as database:
            return await measure_on(workdir, database, count, reps, plain=plain)


async def measure_on(
    workdir: Path, database: str, count: int, reps: int, *, plain: bool = False
) -> dict[str, Any]:
    """The measurement on `database`, empty until the thread is written into it; `plain`: with
    the plain client (`replay-plain`), else with the fast one."""
    thread_id, stored = await build_thread(database, count)
    token = issue_token("alice", ["user"])
    frames_file = workdir / "frames.jsonl"
    ts = "2026-01-01T00:00:00.000Z"
    frames_file.write_text(
        "\n".join(
            f'{{"type":"event","thread_id":"{thread_id}","seq":{seq},"run_id":null,'
            f'"event":"{type_}","ts":"{ts}","data":{data}}}'
            for seq, (type_, data) in enumerate(stored, start=1)
        )
    )
    ceiling_cmd = [
        sys.executable,
        str(Path(__file__).with_name("broadcast_server.py")),
        str(frames_file),
    ]
    with (
        gateway_process(workdir, database=database) as gateway,
        server_process(ceiling_cmd, workdir / "ceiling.log", {}) as ceiling,
    ):
        extensions: list[str] = []

        async def from_gateway() -> tuple[float, list[Any]]:
            nonlocal extensions
            if not plain:
                return await replay_once(gateway.ws_url, token, thread_id, count)
            elapsed, frames, extensions = await plain_replay_once(
                gateway.ws_url, token, thread_id, count
            )
            return elapsed, frames

        from_memory = plain_from_memory_once if plain else from_memory_once
        await from_gateway()  # warm-up
        await from_memory(ceiling.ws_url, count)
        seconds: list[float] = []
        ceiling_seconds: list[float] = []
        checks: list[dict[str, Any]] = []
        # Alternated, so both see the same background load.
        for _ in range(reps):
            elapsed, raws = await from_gateway()
            seconds.append(elapsed)
            checks.append(check(raws, stored, thread_id))
            ceiling_seconds.append(await from_memory(ceiling.ws_url, count))
    rates = [count / s for s in seconds]
    median_rate = statistics.median(rates)
    ceiling_rate = statistics.median(count / s for s in ceiling_seconds)
    correct = all(c["dense"] and c["exact"] and c["events"] == count for c in checks)
    target = TARGET_PLAIN_EVENTS_PER_S if plain else TARGET_EVENTS_PER_S
    return {
        "figure": "5p" if plain else 5,
        "client": "plain websockets, json.loads per frame" if plain else "fast (parse after)",
        **({"extensions_negotiated": extensions} if plain else {}),
        "events": count,
        "reps": reps,
        "replay_ms_median": round(statistics.median(seconds) * 1000, 1),
        "replay_ms_all": [round(s * 1000, 1) for s in seconds],
        "events_per_s_median": round(median_rate),
        "events_per_s_best": round(max(rates)),
        "dense_and_exact": correct,
        "client_ceiling_events_per_s_median": round(ceiling_rate),
        "ratio_to_client_ceiling": round(median_rate / ceiling_rate, 3),
        "target": f">= {target} events/s",
        "met": median_rate >= target and correct,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=10_000, help="thread length (10000)")
    parser.add_argument(
        "--plain-events", type=int, default=6_000, help="replay-plain thread length (6000)"
    )


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    return await measure(args.events, args.reps, backend)


async def run_plain(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    return await measure(args.plain_events, args.reps, backend, plain=True)
