"""Figure 2: one story run watched by many clients, against a broadcast-only ceiling.

    .venv/bin/python -m bench fanout [--clients 200] [--reps 5]

Two servers run side by side as subprocesses, each with `--clients` authenticated watcher
connections from this process:

- the gateway (`python -m gateway serve`, demo delay 0): the watchers subscribe to one thread
  and a separate connection starts story runs on it; everything the gateway sends has been
  stored first;
- the ceiling (`bench/broadcast_server.py`): the same story's event frames, one per model delta
  (exactly what the gateway logs when it merges nothing), sent from memory to every watcher.

Repetitions alternate between the two so both see the same background load. A repetition's
time runs from the trigger (`run.start` / `go`) to the moment the last watcher has the run's
last event. Both servers deliver the same story; the gateway may carry it in fewer frames
(several model deltas merged into one `message.delta` under load), so the like-for-like figure
is `story_events_per_s`: the story's unmerged event count x watchers / time. `frames_per_s`
counts the frames actually received.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection

from bench.common import (
    STORY_INPUT,
    TIMEOUT_S,
    Backend,
    BenchClient,
    ProtocolError,
    clients,
    event_frame,
    fresh_database,
    gateway_process,
    issue_token,
    raise_fd_limit,
    server_process,
    story_events,
)

TARGET_RATIO = 0.8


@dataclass
class Watcher:
    """Counts the frames of one connection; notes when the awaited last event arrives."""

    ws: ClientConnection
    frames: int = 0
    last_seq: int = 0
    gaps: int = 0
    texts: dict[str, list[str]] = field(default_factory=dict)
    done_at: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._read())

    def reset(self) -> None:
        self.frames = 0
        self.texts = {}
        self.done_at = None
        self.done.clear()

    async def _read(self) -> None:
        async for raw in self.ws:
            now = time.perf_counter()
            frame = orjson.loads(raw)
            if frame.get("type") != "event":
                continue
            self.frames += 1
            seq = frame["seq"]
            if seq != self.last_seq + 1:
                self.gaps += 1
            self.last_seq = seq
            if frame["event"] == "message.delta":
                data = frame["data"]
                self.texts.setdefault(data["message_id"], []).append(data["delta"])
            elif frame["event"] == "run.completed":
                self.done_at = now
                self.done.set()


async def _watch(watchers: list[Watcher]) -> float:
    await asyncio.wait_for(asyncio.gather(*(w.done.wait() for w in watchers)), TIMEOUT_S * 4)
    return max(w.done_at or 0.0 for w in watchers)


async def gateway_rep(starter: BenchClient, thread_id: str, watchers: list[Watcher]) -> dict:
    for w in watchers:
        w.reset()
    sent, _, ack = await starter.request("run.start", thread_id=thread_id, input=STORY_INPUT)
    last = await _watch(watchers)
    _, completed = await starter.wait_event("run.completed", ack["run_id"])
    text = completed["data"]["final_output"]
    intact = all(
        "".join(part for parts in w.texts.values() for part in parts) == text for w in watchers
    )
    starter.forget()
    return {"seconds": last - sent, "frames": sum(w.frames for w in watchers), "intact": intact}


async def broadcast_rep(control: ClientConnection, watchers: list[Watcher]) -> dict:
    for w in watchers:
        w.reset()
        w.last_seq = 0
    sent = time.perf_counter()
    await control.send('{"type":"go"}')
    last = await _watch(watchers)
    while orjson.loads(await control.recv()).get("type") != "done":
        pass
    return {"seconds": last - sent, "frames": sum(w.frames for w in watchers), "intact": True}


def summary(reps: list[dict], story_events_n: int, watchers: int) -> dict[str, Any]:
    seconds = [r["seconds"] for r in reps]
    return {
        "reps": len(reps),
        "delivery_ms_median": round(statistics.median(seconds) * 1000, 1),
        "story_events_per_s_median": round(story_events_n * watchers / statistics.median(seconds)),
        "frames_per_s_median": round(statistics.median(r["frames"] / r["seconds"] for r in reps)),
        "frames_per_watcher_median": statistics.median(r["frames"] / watchers for r in reps),
        "text_intact": all(r["intact"] for r in reps),
    }


async def measure(n_clients: int, reps: int, backend: Backend) -> dict[str, Any]:
    raise_fd_limit(4 * n_clients + 256)
    events = await story_events()
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        workdir = Path(tmp)
        frames_file = workdir / "frames.jsonl"
        frames_file.write_text(
            "\n".join(
                event_frame("t_bench", seq, "r_bench", type_, data)
                for seq, (type_, data) in enumerate(events, start=1)
            )
        )
        ceiling_cmd = [
            sys.executable,
            str(Path(__file__).with_name("broadcast_server.py")),
            str(frames_file),
        ]
        async with fresh_database(backend, workdir) as database:
            with (
                gateway_process(workdir, database=database) as gateway,
                server_process(ceiling_cmd, workdir / "ceiling.log", {}) as ceiling,
            ):
                starter = await BenchClient.connect(gateway.ws_url, issue_token("alice", ["user"]))
                _, _, created = await starter.request("thread.create")
                thread_id = created["thread_id"]
                async with (
                    clients(gateway.ws_url, n_clients) as gw_conns,
                    clients(ceiling.ws_url, n_clients + 1) as bc_conns,
                ):
                    for ws in gw_conns:
                        await ws.send(
                            orjson.dumps(
                                {"type": "thread.subscribe", "thread_id": thread_id}
                            ).decode()
                        )
                    for ws in gw_conns:
                        while orjson.loads(await ws.recv()).get("type") != "subscribed":
                            pass
                    gw_watchers = [Watcher(ws) for ws in gw_conns]
                    control, bc_watchers = bc_conns[0], [Watcher(ws) for ws in bc_conns[1:]]
                    for w in (*gw_watchers, *bc_watchers):
                        w.start()
                    # Warm-up: imports, database pages, the first send on every socket.
                    await gateway_rep(starter, thread_id, gw_watchers)
                    await broadcast_rep(control, bc_watchers)
                    gw_reps: list[dict] = []
                    bc_reps: list[dict] = []
                    for _ in range(reps):
                        gw_reps.append(await gateway_rep(starter, thread_id, gw_watchers))
                        bc_reps.append(await broadcast_rep(control, bc_watchers))
                    gaps = sum(w.gaps for w in gw_watchers)
                    for w in (*gw_watchers, *bc_watchers):
                        if w.task is not None:
                            w.task.cancel()
                await starter.close()
    gw = summary(gw_reps, len(events), n_clients)
    bc = summary(bc_reps, len(events), n_clients)
    ratio = gw["story_events_per_s_median"] / bc["story_events_per_s_median"]
    paired = statistics.median(
        b["seconds"] / g["seconds"] for g, b in zip(gw_reps, bc_reps, strict=True)
    )
    return {
        "figure": 2,
        "clients": n_clients,
        "story_events": len(events),
        "gateway": {**gw, "seq_gaps": gaps},
        "ceiling": bc,
        "ratio_gateway_over_ceiling": round(ratio, 3),
        "ratio_paired_median": round(paired, 3),
        "target": f">= {TARGET_RATIO} of the ceiling",
        "met": ratio >= TARGET_RATIO and gaps == 0 and gw["text_intact"],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=200, help="watchers (default 200)")


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    if args.clients < 1 or args.reps < 1:
        raise ProtocolError("--clients and --reps must be >= 1")
    return await measure(args.clients, args.reps, backend)
