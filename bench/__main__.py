"""The benchmark suite: every figure of docs/benchmarks.md, or any part of it.

    .venv/bin/python -m bench                      # every part, one JSON line each
    .venv/bin/python -m bench replay               # one part
    .venv/bin/python -m bench fanout memory --out /tmp/bench.jsonl
    .venv/bin/python -m bench --quick              # smaller sizes, for a smoke run
    .venv/bin/python -m bench --backend both       # every part on SQLite, then on PostgreSQL

Parts (issue figure in brackets): throughput [1], fanout [2], fanout-paced [2p: 100 watchers,
1 ms per delta, frames and bytes per second], start [2b], approval [3], decision [4],
continuation [4c: decide -> the approved call's tool.output], replay [5], replay-plain [5p: a
plain `websockets` client parsing every frame], memory [6], memory-hello [6h: KiB per idle
connection after hello at 1,000, with a raw sans-I/O baseline], idle [6i: 10,000 connections
offering permessage-deflate, RSS and hello latency], concurrency [7], checkpoint
[8], crossprocess (delivery from one gateway process to another, polling and over Redis),
workers (figure 7's load at a faster pace, two worker processes against one), takeover (a run
going on in another gateway after SIGTERM and after SIGKILL of the one streaming it).
`throughput`, `start`, `approval`, `decision` and `continuation` share one gateway
(bench/core.py). Every line carries the part, its figures, the target and whether it was met,
the machine it ran on (nproc, CPU model, load average at the end of the part) and the
database backend it ran on (`backend`).

`--backend sqlite` (the default), `postgresql` or `both`: every gateway subprocess a part starts,
and every database a part opens in-process, is a fresh one of that backend
(`bench.common.fresh_database`: a SQLite file in the part's temporary directory, or a PostgreSQL
database created on BENCH_POSTGRES_URL's server and dropped afterwards). With `both`, each part
runs on SQLite, then on PostgreSQL, before the next part starts.

`--compression off` (the default) or `deflate`: whether the benchmark's WebSocket clients offer
permessage-deflate, as every browser does (`BENCH_COMPRESSION`, which parts read through
`bench.common.client_compression`). The gateway negotiates it as its settings say
(`GATEWAY_WS_COMPRESSION`); the minimal server it is compared with, as uvicorn does by default.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import concurrency, core, crossprocess, fanout, idle, memory, replay, takeover
from bench.common import (
    BACKENDS,
    COMPRESSION_CHOICES,
    COMPRESSION_ENV,
    Backend,
    backend_info,
    emit,
    fresh_database,
    report_line,
)

CORE_PARTS = ("throughput", "start", "approval", "decision", "continuation")
PARTS = (
    "throughput",
    "fanout",
    "fanout-paced",
    "start",
    "approval",
    "decision",
    "continuation",
    "replay",
    "replay-plain",
    "memory",
    "memory-hello",
    "idle",
    "concurrency",
    "checkpoint",
    "crossprocess",
    "workers",
    "takeover",
)
QUICK = {
    "runs": 15,
    "story_runs": 8,
    "clients": 50,
    "reps": 3,
    "events": 10_000,
    "connections": 500,
    "idle_connections": 1000,
    "concurrent_runs": 50,
    "checkpoint_reps": 5,
    "conversation_runs": 5,
    "crossprocess_runs": 5,
    "workers_runs": 50,
    "takeover_tries": 2,
}

THROUGHPUT_TARGET = 0.75
START_P99_MS = 20.0
APPROVAL_P99_MS = 10.0
DECISION_P99_MS = 10.0
CONTINUATION_P99_MS = 15.0
CHECKPOINT_SIZE_RATIO = 0.7
CHECKPOINT_TIME_RATIO = 1.0


def core_lines(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Split bench.core's report into one set of figures per part, with targets."""
    lines: dict[str, dict[str, Any]] = {}
    config = report["config"]
    if "throughput" in report:
        t = report["throughput"]
        ratio = t["ratio_gateway_over_bare"]["runs_per_s_paired_median"]
        lines["throughput"] = {
            "figure": 1,
            **t,
            "config": config,
            "target": f">= {THROUGHPUT_TARGET} of the bare SDK (story runs/s, paired)",
            "met": ratio >= THROUGHPUT_TARGET,
        }
    if "start" in report:
        s = report["start"]
        p99 = s["run_start_to_run_started"]["p99_ms"]
        lines["start"] = {
            "figure": "2b",
            **s,
            "approval_runs_run_start_to_run_started": report.get(
                "approval_runs_run_start_to_run_started"
            ),
            "config": config,
            "target": f"run.start -> run.started p99 <= {START_P99_MS} ms",
            "met": p99 <= START_P99_MS,
        }
    if "approval" in report:
        a = report["approval"]
        # The tool call is the server's moment (tool.called's `ts`), approval.requested the
        # client's arrival; the client-only gap is reported beside it (`met_client_gap`).
        p99 = a["tool_call_to_approval_requested_at_client"]["p99_ms"]
        lines["approval"] = {
            "figure": 3,
            **a,
            "config": config,
            "target": (
                f"tool call (tool.called ts) -> approval.requested at the client p99 <= "
                f"{APPROVAL_P99_MS} ms"
            ),
            "met": p99 <= APPROVAL_P99_MS,
            "met_client_gap": a["tool_called_to_approval_requested"]["p99_ms"] <= APPROVAL_P99_MS,
        }
    if "decision" in report:
        d = report["decision"]
        p99 = d["decide_to_run_resumed"]["p99_ms"]
        lines["decision"] = {
            "figure": 4,
            **d,
            "config": config,
            "target": (
                "approval.decide -> run.resumed (first continuation event) "
                f"p99 <= {DECISION_P99_MS} ms"
            ),
            "met": p99 <= DECISION_P99_MS,
        }
    if "continuation" in report:
        c = report["continuation"]
        p99 = c["decide_to_approved_tool_output"]["p99_ms"]
        lines["continuation"] = {
            "figure": "4c",
            **c,
            "config": config,
            "target": (
                "approval.decide -> the approved call's tool.output at the client "
                f"p99 <= {CONTINUATION_P99_MS} ms"
            ),
            "met": p99 <= CONTINUATION_P99_MS,
        }
    return lines


async def checkpoint(args: argparse.Namespace, backend: Backend) -> dict[str, Any]:
    from bench.durability import checkpoint_sizes

    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        async with fresh_database(backend, Path(tmp), "conversation") as database:
            sizes = await checkpoint_sizes(database, args.checkpoint_reps, args.conversation_runs)
    summaries = [sizes["five_tool_turns"]["summary"], sizes["growing_conversation"]["summary"]]
    size_ratio = max(s["size_ratio_median"] for s in summaries)
    time_ratio = max(s["time_ratio_median"] for s in summaries)
    return {
        "figure": 8,
        "method": sizes["method"],
        "five_tool_turns": sizes["five_tool_turns"]["summary"],
        "growing_conversation": sizes["growing_conversation"]["summary"],
        "size_ratio_worst_median": size_ratio,
        "time_ratio_worst_median": time_ratio,
        "target": (
            f"compact / to_string(): bytes <= {CHECKPOINT_SIZE_RATIO}, "
            f"time <= {CHECKPOINT_TIME_RATIO}"
        ),
        "met": size_ratio <= CHECKPOINT_SIZE_RATIO and time_ratio <= CHECKPOINT_TIME_RATIO,
    }


Runner = Callable[[argparse.Namespace, Backend], Awaitable[dict[str, Any]]]
STANDALONE: dict[str, Runner] = {
    "crossprocess": crossprocess.run,
    "fanout": fanout.run,
    "fanout-paced": fanout.run_paced,
    "replay": replay.run,
    "replay-plain": replay.run_plain,
    "memory": memory.run,
    "memory-hello": memory.run_hello,
    "idle": idle.run,
    "concurrency": concurrency.run,
    "workers": concurrency.run_workers,
    "takeover": takeover.run,
    "checkpoint": checkpoint,
}


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    root.add_argument("parts", nargs="*", metavar="PART", help="any of: " + ", ".join(PARTS))
    root.add_argument("--out", type=Path, help="also append every JSON line to this file")
    root.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    root.add_argument(
        "--backend",
        choices=(*BACKENDS, "both"),
        default="sqlite",
        help="database of the gateways and of in-process stores; both: each part on each (sqlite)",
    )
    root.add_argument(
        "--compression",
        choices=COMPRESSION_CHOICES,
        default="off",
        help="whether the clients offer permessage-deflate as browsers do (off)",
    )
    root.add_argument("--runs", type=int, default=60, help="runs per latency figure (60)")
    root.add_argument("--story-runs", type=int, default=20, help="throughput story runs (20)")
    root.add_argument("--reps", type=int, default=5, help="repetitions (fanout, replay) (5)")
    root.add_argument("--checkpoint-reps", type=int, default=15, help="checkpoint reps (15)")
    root.add_argument(
        "--conversation-runs", type=int, default=20, help="checkpoint conversation runs (20)"
    )
    fanout.add_arguments(root)
    replay.add_arguments(root)
    memory.add_arguments(root)
    idle.add_arguments(root)
    concurrency.add_arguments(root)
    crossprocess.add_arguments(root)
    takeover.add_arguments(root)
    return root


def selected_backends(choice: str) -> tuple[Backend, ...]:
    """The backends `--backend` names, in the order they run."""
    return BACKENDS if choice == "both" else tuple(b for b in BACKENDS if b == choice)


async def main_async(args: argparse.Namespace) -> int:
    parts = [p for p in PARTS if p in (args.parts or PARTS)]
    wanted_core = tuple(p for p in parts if p in CORE_PARTS)
    backends = selected_backends(args.backend)
    info = {backend: await backend_info(backend) for backend in backends}
    for part in parts:
        if part in CORE_PARTS and part != wanted_core[0]:
            continue  # measured together with the first core part
        for backend in backends:
            begin = time.perf_counter()
            if part in CORE_PARTS:
                report = await core.benchmark(wanted_core, args.runs, args.story_runs, backend)
                for name, figures in core_lines(report).items():
                    emit(
                        report_line(
                            name, backend, figures, **info[backend], elapsed_s=report["elapsed_s"]
                        ),
                        args.out,
                    )
                continue
            figures = await STANDALONE[part](args, backend)
            elapsed_s = round(time.perf_counter() - begin, 1)
            emit(
                report_line(part, backend, figures, **info[backend], elapsed_s=elapsed_s), args.out
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    command = parser()
    args = command.parse_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        command.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    # Read by every client the parts open, and by the parts' own subprocesses.
    os.environ[COMPRESSION_ENV] = args.compression
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
