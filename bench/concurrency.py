"""Figure 7: many concurrent runs streaming at a fixed pace, one watcher each.

    .venv/bin/python -m bench concurrency [--concurrent-runs 200] [--delta-ms 20]

The gateway runs with `GATEWAY_DEMO_DELAY_MS=--delta-ms` (20 ms: the demo model streams 50
deltas per second per run). `--concurrent-runs` connections each start one story run on a fresh
thread, all at once, and watch it (the starting connection is subscribed from the run's first
event). Every frame is stamped with the client's wall clock (`time.time()`) on arrival; raw
frames are kept and parsed only after the runs end, so the client stays cheap while measuring.

- delivery lag of an event = arrival wall clock - the event's `ts` (the server's wall clock when
  the gateway created the event, right after the SDK yielded it; truncated to the millisecond,
  so lags read up to 1 ms high). Same machine, same clock.
- nothing dropped: every run reaches `run.completed`, its seqs are dense from `run.started`, the
  `message.delta`s of each message join up to exactly its `message.completed` text, and no
  connection is closed by the server (4009 = too slow).
- pace: each run's model deltas / (last - first `message.delta` ts); below 50/s means the
  machine could not keep the demo model at its pace (the lag figure does not see that).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import websockets
from websockets.asyncio.client import ClientConnection

from bench.common import (
    ROOT,
    STORY_INPUT,
    Backend,
    clients,
    fresh_database,
    gateway_process,
    latency_summary,
    process_tree_cpu_seconds,
    raise_fd_limit,
)

TARGET_P99_MS = 50.0
COMPLETION_TIMEOUT_S = 300.0


def ts_epoch(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


async def watch(ws: ClientConnection, index: int) -> dict[str, Any]:
    """Start one run and keep every frame until its `run.completed`."""
    stamped: list[tuple[float, str | bytes]] = []
    await ws.send(
        orjson.dumps({"type": "run.start", "id": f"s{index}", "input": STORY_INPUT}).decode()
    )
    closed_code: int | None = None
    try:
        async for raw in ws:
            stamped.append((time.time(), raw))
            if '"run.completed"' in raw or '"run.failed"' in raw:  # type: ignore[operator]
                break
    except websockets.ConnectionClosed as exc:
        closed_code = exc.rcvd.code if exc.rcvd else None
    return {"frames": stamped, "closed": closed_code}


def analyse(result: dict[str, Any]) -> dict[str, Any]:
    # event type -> delivery lags (arrival - `ts`) of that type, in arrival order
    by_event: dict[str, list[float]] = {}
    seqs: list[int] = []
    parts: dict[str, list[str]] = {}
    completed_text: dict[str, str] = {}
    delta_ts: list[float] = []
    # (ts, lag) of each delta, for where in time the late ones are
    delta_lags_at: list[tuple[float, float]] = []
    model_deltas = 0
    completed = False
    for arrived, raw in result["frames"]:
        frame = orjson.loads(raw)
        if frame.get("type") != "event":
            continue
        sent = ts_epoch(frame["ts"])
        by_event.setdefault(frame["event"], []).append(arrived - sent)
        seqs.append(frame["seq"])
        data = frame["data"]
        if frame["event"] == "message.delta":
            delta_ts.append(sent)
            delta_lags_at.append((sent, arrived - sent))
            parts.setdefault(data["message_id"], []).append(data["delta"])
            model_deltas += len(data["delta"].split())
        elif frame["event"] == "message.completed":
            completed_text[data["message_id"]] = data["text"]
        elif frame["event"] == "run.completed":
            completed = True
    intact = bool(completed_text) and all(
        "".join(parts.get(mid, [])) == text for mid, text in completed_text.items()
    )
    span = (delta_ts[-1] - delta_ts[0]) if len(delta_ts) > 1 else 0.0
    return {
        "by_event": by_event,
        "dense": seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else False,
        "intact": intact,
        "completed": completed,
        "closed": result["closed"],
        "frames": len(seqs),
        "model_deltas": model_deltas,
        "pace": model_deltas / span if span else None,
        "first_ts": delta_ts[0] if delta_ts else None,
        "last_ts": delta_ts[-1] if delta_ts else None,
        "delta_lags_at": delta_lags_at,
    }


async def measure(runs: int, delta_ms: int, backend: Backend, workers: int = 1) -> dict[str, Any]:
    raise_fd_limit(2 * runs + 512)
    # Several workers (`serve --workers`): each run and its watcher share a connection, so
    # nothing needs to cross between them; the CPU figures add up every worker's.
    env = {"GATEWAY_WORKERS": str(workers)}
    with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as tmp:
        workdir = Path(tmp)
        async with fresh_database(backend, workdir) as database:
            with gateway_process(
                workdir, database=database, demo_delay_ms=delta_ms, env=env
            ) as gateway:
                async with clients(gateway.ws_url, runs) as conns:
                    cpu_before = process_tree_cpu_seconds(gateway.pid)
                    begin = time.perf_counter()
                    results = await asyncio.wait_for(
                        asyncio.gather(*(watch(ws, i) for i, ws in enumerate(conns))),
                        COMPLETION_TIMEOUT_S,
                    )
                    elapsed = time.perf_counter() - begin
                    cpu_after = process_tree_cpu_seconds(gateway.pid)
    runs_seen = [analyse(r) for r in results]
    paces = [r["pace"] for r in runs_seen if r["pace"]]
    firsts = [r["first_ts"] for r in runs_seen if r["first_ts"]]
    lasts = [r["last_ts"] for r in runs_seen if r["last_ts"]]
    model_deltas = sum(r["model_deltas"] for r in runs_seen)
    nothing_dropped = all(
        r["completed"] and r["dense"] and r["intact"] and r["closed"] is None for r in runs_seen
    )
    by_event: dict[str, list[float]] = {}
    for r in runs_seen:
        for event, event_lags in r["by_event"].items():
            by_event.setdefault(event, []).extend(event_lags)
    delta_lags = by_event.get("message.delta", [])
    delta_summary = latency_summary(delta_lags)
    # Deltas over the target, by the second of the test their `ts` falls in: a tail made at
    # the runs' start, at their end (completions) or all along.
    late_by_second = Counter(
        int(sent - min(firsts))
        for r in runs_seen
        for sent, lag in r["delta_lags_at"]
        if lag * 1000 > TARGET_P99_MS
    )
    all_summary = latency_summary([lag for lags in by_event.values() for lag in lags])
    return {
        "figure": 7,
        "workers": workers,
        "concurrent_runs": runs,
        "demo_delay_ms": delta_ms,
        "target_pace_per_run": round(1000 / delta_ms, 1) if delta_ms else None,
        "elapsed_s": round(elapsed, 2),
        # The gateway process's CPU time over the measurement (all threads): near elapsed_s
        # means it was CPU-bound, and with it its event loop, so events waited in queues.
        "server_cpu_s": round(cpu_after - cpu_before, 2)
        if cpu_before is not None and cpu_after is not None
        else None,
        "server_cpu_us_per_model_delta": round(
            (cpu_after - cpu_before) * 1e6 / max(1, sum(r["model_deltas"] for r in runs_seen))
        )
        if cpu_before is not None and cpu_after is not None
        else None,
        "delivery_lag_message_delta": delta_summary,
        "delivery_lag_all_events": all_summary,
        # Which events make the tail: every run starts and ends within the same second, so
        # each run's last events (behind its completion checkpoint) arrive in one burst.
        "delivery_lag_p99_ms_by_event": {
            event: latency_summary(event_lags)["p99_ms"]
            for event, event_lags in sorted(by_event.items())
        },
        "late_deltas_by_second": {
            "over_ms": TARGET_P99_MS,
            "count": sum(late_by_second.values()),
            "by_second": {str(second): n for second, n in sorted(late_by_second.items())},
        },
        "frames_total": sum(r["frames"] for r in runs_seen),
        "message_delta_frames": len(delta_lags),
        "model_deltas": model_deltas,
        "model_deltas_per_frame": round(model_deltas / max(1, len(delta_lags)), 2),
        "pace_per_run_median": round(statistics.median(paces), 1) if paces else None,
        "pace_per_run_min": round(min(paces), 1) if paces else None,
        "model_deltas_per_s_all_runs": round(model_deltas / (max(lasts) - min(firsts)))
        if firsts and lasts and max(lasts) > min(firsts)
        else None,
        "runs_completed": sum(r["completed"] for r in runs_seen),
        "runs_dense": sum(r["dense"] for r in runs_seen),
        "runs_text_intact": sum(r["intact"] for r in runs_seen),
        "connections_closed_by_server": sum(r["closed"] is not None for r in runs_seen),
        "nothing_dropped": nothing_dropped,
        "target": f"p99 delivery lag <= {TARGET_P99_MS} ms, nothing dropped",
        "met": delta_summary["p99_ms"] <= TARGET_P99_MS and nothing_dropped,
        # The stricter reading: every event of every run, not only the streamed deltas.
        "met_all_events": all_summary["p99_ms"] <= TARGET_P99_MS and nothing_dropped,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrent-runs", type=int, default=200, help="runs at once (default 200)"
    )
    parser.add_argument(
        "--delta-ms", type=int, default=20, help="demo model delay per delta (default 20)"
    )
    parser.add_argument(
        "--workers-runs", type=int, default=200, help="workers: runs at once (default 200)"
    )
    parser.add_argument(
        "--workers-delta-ms", type=int, default=5, help="workers: delay per delta (default 5)"
    )


# The gateway's CPU per model delta, at most this many times the bare SDK's under the same load.
TARGET_CPU_RATIO = 1.4


async def bare_sdk(runs: int, delta_ms: int) -> dict[str, Any]:
    """bench/bare_sdk_load.py in a process of its own: the SDK's CPU per delta at this load."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.bare_sdk_load",
        str(runs),
        str(delta_ms),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), COMPLETION_TIMEOUT_S)
    if process.returncode != 0:
        raise RuntimeError(f"bench.bare_sdk_load exited with {process.returncode}")
    figures: dict[str, Any] = orjson.loads(out.splitlines()[-1])
    return figures


async def run(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    gateway = await measure(args.concurrent_runs, args.delta_ms, backend)
    bare = await bare_sdk(args.concurrent_runs, args.delta_ms)
    gateway_cpu = gateway["server_cpu_us_per_model_delta"]
    ratio = round(gateway_cpu / bare["cpu_us_per_model_delta"], 2) if gateway_cpu else None
    return {
        **gateway,
        "bare_sdk": bare,
        "cpu_per_delta_gateway_over_bare_sdk": ratio,
        "cpu_target": f"<= {TARGET_CPU_RATIO}x the bare SDK's CPU per model delta",
        "cpu_met": ratio is not None and ratio <= TARGET_CPU_RATIO,
    }


WORKERS_TARGET_RATIO = 1.6


async def run_workers(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    """Figure 7 with two worker processes against one, in the same run, at a load one
    process cannot keep up with (`--workers-runs` runs at `--workers-delta-ms`): the model
    deltas per second all runs sustained, and whether anything was dropped."""
    one = await measure(args.workers_runs, args.workers_delta_ms, backend, workers=1)
    two = await measure(args.workers_runs, args.workers_delta_ms, backend, workers=2)
    rate_one, rate_two = one["model_deltas_per_s_all_runs"], two["model_deltas_per_s_all_runs"]
    ratio = round(rate_two / rate_one, 2) if rate_one and rate_two else None
    return {
        "figure": "7w",
        "offered_deltas_per_s": round(args.workers_runs * 1000 / args.workers_delta_ms),
        "one_worker": _brief(one),
        "two_workers": _brief(two),
        "ratio_deltas_per_s": ratio,
        "target": f"two workers >= {WORKERS_TARGET_RATIO}x one, nothing dropped",
        "met": ratio is not None
        and ratio >= WORKERS_TARGET_RATIO
        and one["nothing_dropped"]
        and two["nothing_dropped"],
    }


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "model_deltas_per_s_all_runs",
        # Above 1 where watchers fell behind and the gateway merged consecutive deltas.
        "model_deltas_per_frame",
        "pace_per_run_median",
        "delivery_lag_message_delta",
        "server_cpu_s",
        "elapsed_s",
        "nothing_dropped",
    )
    return {key: result[key] for key in keys}
