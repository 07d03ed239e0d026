"""Figure 2: one story run watched by many clients, against a broadcast-only ceiling.

    .venv/bin/python -m bench fanout [--clients 200] [--reps 5]
    .venv/bin/python -m bench fanout-paced [--paced-clients 100] [--paced-delay-ms 1] [--reps 5]

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

`fanout-paced` is the same comparison with the demo model at a pace
(`GATEWAY_DEMO_DELAY_MS`, 1 ms per delta by default) and 100 watchers: at that pace the gateway
merges (almost) nothing, so it sends one frame per model delta. The ceiling then sends exactly
the frames one gateway watcher received in the warm-up run (same count, same bytes), so the
like-for-like figures are `frames_per_s` and `bytes_per_s` (frames and UTF-8 bytes received by
all watchers / time). The ceiling sends them at the model's pace (`--pace-ms`: the same wait
before each `message.delta` frame as the demo model's before each text delta), so the story
lasts as long on both when sending costs nothing; `ceiling_unpaced`, the same frames sent back
to back, is reported beside it (that ratio is bounded by the model's pace whatever the gateway
costs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
    process_cpu_seconds,
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
    bytes: int = 0
    last_seq: int = 0
    gaps: int = 0
    texts: dict[str, list[str]] = field(default_factory=dict)
    done_at: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    # The event frames as received, kept only by the one watcher whose frames the ceiling
    # replays (None: not kept).
    raws: list[str] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._read())

    def reset(self) -> None:
        self.frames = 0
        self.bytes = 0
        if self.raws is not None:
            self.raws = []
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
            text = raw if isinstance(raw, str) else raw.decode()
            self.bytes += len(text) if text.isascii() else len(text.encode())
            if self.raws is not None:
                self.raws.append(text)
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


async def gateway_rep(
    starter: BenchClient, thread_id: str, watchers: list[Watcher], pid: int
) -> dict:
    cpu_before = process_cpu_seconds(pid) or 0.0
    for w in watchers:
        w.reset()
    sent, _, ack = await starter.request("run.start", thread_id=thread_id, input=STORY_INPUT)
    last = await _watch(watchers)
    _, completed = await starter.wait_event("run.completed", ack["run_id"])
    cpu_s = (process_cpu_seconds(pid) or 0.0) - cpu_before
    text = completed["data"]["final_output"]
    intact = all(
        "".join(part for parts in w.texts.values() for part in parts) == text for w in watchers
    )
    starter.forget()
    return {
        "seconds": last - sent,
        "frames": sum(w.frames for w in watchers),
        "bytes": sum(w.bytes for w in watchers),
        "cpu_s": cpu_s,
        "intact": intact,
    }


async def broadcast_rep(control: ClientConnection, watchers: list[Watcher], pid: int) -> dict:
    cpu_before = process_cpu_seconds(pid) or 0.0
    for w in watchers:
        w.reset()
        w.last_seq = 0
    sent = time.perf_counter()
    await control.send('{"type":"go"}')
    last = await _watch(watchers)
    while orjson.loads(await control.recv()).get("type") != "done":
        pass
    cpu_s = (process_cpu_seconds(pid) or 0.0) - cpu_before
    return {
        "seconds": last - sent,
        "frames": sum(w.frames for w in watchers),
        "bytes": sum(w.bytes for w in watchers),
        "cpu_s": cpu_s,
        "intact": True,
    }


def summary(reps: list[dict], story_events_n: int, watchers: int) -> dict[str, Any]:
    seconds = [r["seconds"] for r in reps]
    return {
        "reps": len(reps),
        "delivery_ms_median": round(statistics.median(seconds) * 1000, 1),
        "story_events_per_s_median": round(story_events_n * watchers / statistics.median(seconds)),
        "frames_per_s_median": round(statistics.median(r["frames"] / r["seconds"] for r in reps)),
        "bytes_per_s_median": round(statistics.median(r["bytes"] / r["seconds"] for r in reps)),
        "bytes_per_frame_mean": round(
            sum(r["bytes"] for r in reps) / sum(r["frames"] for r in reps)
        ),
        "frames_per_watcher_median": statistics.median(r["frames"] / watchers for r in reps),
        # The server's CPU (user + system) per frame delivered: steadier than the rates on a
        # busy machine, as it leaves out the time spent waiting for a core.
        "server_cpu_us_per_frame_median": round(
            statistics.median(r["cpu_s"] / r["frames"] * 1e6 for r in reps), 2
        ),
        "text_intact": all(r["intact"] for r in reps),
    }


async def subscribed_watchers(conns: list[ClientConnection], thread_id: str) -> list[Watcher]:
    for ws in conns:
        await ws.send(orjson.dumps({"type": "thread.subscribe", "thread_id": thread_id}).decode())
    for ws in conns:
        while orjson.loads(await ws.recv()).get("type") != "subscribed":
            pass
    watchers = [Watcher(ws) for ws in conns]
    for w in watchers:
        w.start()
    return watchers


def ceiling_command(frames_file: Path, frames: list[str], pace_ms: int = 0) -> list[str]:
    frames_file.write_text("\n".join(frames))
    script = str(Path(__file__).with_name("broadcast_server.py"))
    return [
        sys.executable,
        script,
        str(frames_file),
        *(["--pace-ms", str(pace_ms)] if pace_ms else []),
    ]


async def measure(
    n_clients: int, reps: int, backend: Backend, *, delay_ms: int = 0
) -> dict[str, Any]:
    """Alternating repetitions on the gateway (demo model at `delay_ms` per delta) and the
    ceiling. At delay 0 the ceiling sends the story's unmerged frames made in-process; with a
    pace it sends the frames a gateway watcher received in the warm-up run, at the model's
    pace (`ceiling`) and unpaced (`ceiling_unpaced`)."""
    raise_fd_limit(6 * n_clients + 256)
    events = await story_events()
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        workdir = Path(tmp)
        async with (
            fresh_database(backend, workdir) as database,
            contextlib.AsyncExitStack() as stack,
        ):
            gateway = stack.enter_context(
                gateway_process(workdir, database=database, demo_delay_ms=delay_ms)
            )
            starter = await BenchClient.connect(gateway.ws_url, issue_token("alice", ["user"]))
            stack.push_async_callback(starter.close)
            _, _, created = await starter.request("thread.create")
            thread_id = created["thread_id"]
            gw_conns = await stack.enter_async_context(clients(gateway.ws_url, n_clients))
            gw_watchers = await subscribed_watchers(gw_conns, thread_id)
            # Warm-up: imports, database pages, the first send on every socket.
            if delay_ms:
                gw_watchers[0].raws = []
            await gateway_rep(starter, thread_id, gw_watchers, gateway.pid)
            if delay_ms:
                frames = gw_watchers[0].raws or []
                gw_watchers[0].raws = None
            else:
                frames = [
                    event_frame("t_bench", seq, "r_bench", type_, data)
                    for seq, (type_, data) in enumerate(events, start=1)
                ]
            paces = {"ceiling": delay_ms, "ceiling_unpaced": 0} if delay_ms else {"ceiling": 0}
            ceilings: dict[str, tuple[ClientConnection, list[Watcher], int]] = {}
            for name, pace_ms in paces.items():
                command = ceiling_command(workdir / f"{name}.jsonl", frames, pace_ms)
                server = stack.enter_context(server_process(command, workdir / f"{name}.log", {}))
                conns = await stack.enter_async_context(clients(server.ws_url, n_clients + 1))
                control, watchers = conns[0], [Watcher(ws) for ws in conns[1:]]
                for w in watchers:
                    w.start()
                await broadcast_rep(control, watchers, server.pid)
                ceilings[name] = (control, watchers, server.pid)
            gw_reps: list[dict] = []
            ceiling_reps: dict[str, list[dict]] = {name: [] for name in ceilings}
            for _ in range(reps):
                gw_reps.append(await gateway_rep(starter, thread_id, gw_watchers, gateway.pid))
                for name, (control, watchers, pid) in ceilings.items():
                    ceiling_reps[name].append(await broadcast_rep(control, watchers, pid))
            gaps = sum(w.gaps for w in gw_watchers)
            every = [*gw_watchers, *(w for _, ws, _ in ceilings.values() for w in ws)]
            for w in every:
                if w.task is not None:
                    w.task.cancel()
    gw = summary(gw_reps, len(events), n_clients)
    ceiling_figures = {name: summary(r, len(events), n_clients) for name, r in ceiling_reps.items()}
    bc_reps = ceiling_reps["ceiling"]
    paired = statistics.median(
        b["seconds"] / g["seconds"] for g, b in zip(gw_reps, bc_reps, strict=True)
    )
    return {
        "clients": n_clients,
        "demo_delay_ms": delay_ms,
        "story_events": len(events),
        "ceiling_frames": len(frames),
        "gateway": {**gw, "seq_gaps": gaps},
        **ceiling_figures,
        "ratio_paired_median": round(paired, 3),
        "ratio_server_cpu_per_frame": round(
            gw["server_cpu_us_per_frame_median"]
            / ceiling_figures["ceiling"]["server_cpu_us_per_frame_median"],
            3,
        ),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=200, help="watchers (default 200)")
    parser.add_argument(
        "--paced-clients", type=int, default=100, help="fanout-paced watchers (default 100)"
    )
    parser.add_argument(
        "--paced-delay-ms",
        type=int,
        default=1,
        help="fanout-paced: the demo model's pace, ms per delta (default 1)",
    )


def intact(figures: dict[str, Any]) -> bool:
    gateway = figures["gateway"]
    return gateway["seq_gaps"] == 0 and gateway["text_intact"]


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    if args.clients < 1 or args.reps < 1:
        raise ProtocolError("--clients and --reps must be >= 1")
    figures = await measure(args.clients, args.reps, backend)
    ratio = (
        figures["gateway"]["story_events_per_s_median"]
        / figures["ceiling"]["story_events_per_s_median"]
    )
    return {
        "figure": 2,
        **figures,
        "ratio_gateway_over_ceiling": round(ratio, 3),
        "target": f">= {TARGET_RATIO} of the ceiling",
        "met": ratio >= TARGET_RATIO and intact(figures),
    }


async def run_paced(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    if args.paced_clients < 1 or args.reps < 1 or args.paced_delay_ms < 1:
        raise ProtocolError("--paced-clients, --paced-delay-ms and --reps must be >= 1")
    figures = await measure(args.paced_clients, args.reps, backend, delay_ms=args.paced_delay_ms)
    gw, bc, unpaced = figures["gateway"], figures["ceiling"], figures["ceiling_unpaced"]
    frames_ratio = gw["frames_per_s_median"] / bc["frames_per_s_median"]
    bytes_ratio = gw["bytes_per_s_median"] / bc["bytes_per_s_median"]
    return {
        "figure": "2p",
        **figures,
        "ratio_frames_per_s": round(frames_ratio, 3),
        "ratio_bytes_per_s": round(bytes_ratio, 3),
        # Against the same frames sent as fast as the server can: bounded by the model's pace.
        "ratio_frames_per_s_unpaced": round(
            gw["frames_per_s_median"] / unpaced["frames_per_s_median"], 3
        ),
        "target": f"frames/s >= {TARGET_RATIO} of the ceiling's at the same pace",
        "met": frames_ratio >= TARGET_RATIO and intact(figures),
    }
