"""Core gateway benchmarks: streaming throughput and the latencies of the approval path.

    .venv/bin/python -m bench.core [--runs 60] [--story-runs 20] [--out FILE]
                                   [--only throughput|approval|decision|continuation|start]
                                   [--backend sqlite|postgresql]

The gateway runs as a subprocess (`python -m gateway serve --port 0`) with a fresh database
(`bench.common.fresh_database`: a SQLite file in a temporary directory, or a PostgreSQL
database of its own), so the benchmark's clients and the server never share an
event loop. The clients are plain `websockets` connections that timestamp every frame with
`time.perf_counter()` as soon as it is read off the socket. One JSON line with every figure is
printed to stdout (and written to --out). See docs/benchmarks.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bench.common import (
    BACKENDS,
    ROOT,
    SECRET,
    TENANT,
    TIMEOUT_S,
    Backend,
    BenchClient,
    Frame,
    GatewayProcess,
    ProtocolError,
    emit,
    fresh_database,
    gateway_process,
    latency_summary,
    machine_info,
    percentile,
)
from gateway.auth.access import TokenVerifier

if TYPE_CHECKING:
    from gateway.event_log.writer import EventLog
    from persistence.sessions import GatewaySession
    from persistence.store import Store

__all__ = ["ROOT", "SECRET", "TENANT", "latency_summary", "machine_info", "percentile"]

STORY_INPUT = "tell me a story"
REFUND_INPUT = "refund order 42 for 30"
START_INPUT = "hello there"
WARMUP_RUNS = 3
PARTS = ("throughput", "approval", "decision", "continuation", "start")
DATABASES: dict[Backend, str] = {
    "sqlite": "sqlite+aiosqlite (fresh file in a temp dir)",
    "postgresql": "postgresql+asyncpg (fresh database, dropped afterwards)",
}


@dataclass
class Session:
    user: BenchClient
    reviewer: BenchClient


@contextlib.asynccontextmanager
async def session(gateway: GatewayProcess) -> AsyncIterator[Session]:
    verifier = TokenVerifier(SECRET)
    user = await BenchClient.connect(gateway.ws_url, verifier.issue("alice", TENANT, ["user"]))
    reviewer = await BenchClient.connect(
        gateway.ws_url, verifier.issue("rita", TENANT, ["reviewer"])
    )
    try:
        yield Session(user, reviewer)
    finally:
        await user.close()
        await reviewer.close()


# --------------------------------------------------------------------------------------------
# The measurements.
# --------------------------------------------------------------------------------------------


async def one_plain_run(client: BenchClient, text: str) -> dict[str, Any]:
    """Start a run on a fresh thread and wait until it completes; return its timings."""
    client.forget()
    sent, arrived, ack = await client.request("run.start", input=text)
    run_id = ack["run_id"]
    completed_at, completed = await client.wait_event("run.completed", run_id)
    events = client.run_events(run_id)
    started_at = next(t for t, f in events if f["event"] == "run.started")
    first = next(i for i, (_, f) in enumerate(events) if f["event"] == "run.started")
    last = next(i for i, (_, f) in enumerate(events) if f["event"] == "run.completed")
    return {
        "start_sent": sent,
        "ack_at": arrived,
        "started_at": started_at,
        "completed_at": completed_at,
        "events": last - first + 1,
        "deltas": sum(1 for _, f in events[first : last + 1] if f["event"] == "message.delta"),
        "final_words": len(str(completed["data"]["final_output"]).split()),
    }


def bare_sdk_agent() -> Any:
    """The demo agent the bare-SDK runs share, built once as the gateway builds it once per
    graph version (`RunContext.agent`): building it (tool schemas) costs ~3 ms, a third of a
    story run, and belongs to neither side's per-run cost."""
    from gateway.agents.demo.assistant import build_demo_agent

    return build_demo_agent()


@dataclass
class DurableSdk:
    """What the in-process rungs of figure 1 keep: the thread's SDK session (the gateway's own
    `GatewaySession`, a copy of `sessions` per thread) and, for the event-log rung, the
    gateway's `EventLog`, both on one migrated database of their own."""

    sessions: GatewaySession
    store: Store
    log: EventLog


async def sdk_run(
    agent: Any, durable: DurableSdk | None = None, *, logged: bool = False
) -> tuple[int, float]:
    """The same demo story consumed in-process by the SDK: no gateway, nothing sent.

    Bare without `durable`. With it, also what any gateway keeping this design's durability
    pays before it stores or sends a single event: a thread of its own, its session (history
    read and turn appended in the backend's database) and the completion checkpoint's
    serialisation. `logged` adds what a gateway that stores every event before anyone sees
    it pays on top: each stream event translated to protocol events
    (`gateway/run_lifecycle/stream_translation.py`) and appended to the event log, the
    streamed events in group commits and `run.completed` in one commit of its own, awaited.
    Returns the stream events counted and the seconds taken."""
    from agents import RunConfig, Runner

    from gateway.agents.demo.assistant import OfflineModelProvider
    from gateway.protocol.frames import EventType
    from gateway.run_lifecycle.stream_translation import StreamTranslator, output_text
    from persistence.threads import ThreadRepository

    begin = time.perf_counter()
    session, thread_id = None, ""
    if durable is not None:
        thread = await ThreadRepository(durable.store).create(tenant=TENANT, owner="alice")
        session, thread_id = durable.sessions.for_session(thread.thread_id), thread.thread_id
    log = durable.log if durable is not None and logged else None
    result = Runner.run_streamed(
        agent,
        STORY_INPUT,
        session=session,
        run_config=RunConfig(model_provider=OfflineModelProvider(0), tracing_disabled=True),
    )
    translator = StreamTranslator(agent=agent.name)
    count = 0
    async for event in result.stream_events():
        count += 1
        if log is not None:
            for type_, data in translator.translate(event):
                await log.append(thread_id, None, type_, data)
    if durable is not None:
        orjson.dumps(result.to_state().to_json())
    if log is not None:
        final = output_text(result.final_output)
        completed = {"final_output": final}
        await log.commit([log.new_event(thread_id, None, EventType.RUN_COMPLETED, completed)])
    return count, time.perf_counter() - begin


@contextlib.asynccontextmanager
async def durable_sdk(database: str) -> AsyncIterator[DurableSdk]:
    """A migrated database with a `GatewaySession` template and a running event log; the
    checkpoint serialised as the gateway does it (gateway/agents/identity_shortcut.py)."""
    from gateway.agents import identity_shortcut
    from gateway.event_log.bus import EventBus
    from gateway.event_log.writer import EventLog
    from persistence.backends import open_store
    from persistence.schema import migrate
    from persistence.sessions import GatewaySession

    identity_shortcut.install()
    store = open_store(database)
    try:
        await migrate(store)
        log = EventLog(store, EventBus())
        await log.start()
        try:
            yield DurableSdk(GatewaySession("template", store=store), store, log)
        finally:
            await log.close()
    finally:
        await store.close()


async def throughput(client: BenchClient, runs: int, backend: Backend) -> dict[str, Any]:
    """Gateway story runs and bare-SDK story runs, interleaved one for one.

    Interleaving keeps both sides under the same background load, so the ratio stays
    meaningful on a shared machine even when the absolute figures drift.
    """
    agent = bare_sdk_agent()
    results: list[dict[str, Any]] = []
    bare: list[tuple[int, float]] = []
    floor: list[float] = []
    logged: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gateway-bench-floor-") as folder:
        async with (
            fresh_database(backend, Path(folder), "floor") as database,
            durable_sdk(database) as durable,
        ):
            for _ in range(WARMUP_RUNS):
                await sdk_run(agent)
                await sdk_run(agent, durable)
                await sdk_run(agent, durable, logged=True)
            for _ in range(runs):
                results.append(await one_plain_run(client, STORY_INPUT))
                bare.append(await sdk_run(agent))
                floor.append((await sdk_run(agent, durable))[1])
                logged.append((await sdk_run(agent, durable, logged=True))[1])

    rates = [r["events"] / (r["completed_at"] - r["started_at"]) for r in results]
    run_seconds = [r["completed_at"] - r["start_sent"] for r in results]
    total_events = sum(r["events"] for r in results)
    total_seconds = sum(r["completed_at"] - r["started_at"] for r in results)
    gateway = {
        "runs": runs,
        "events_per_run": statistics.median(r["events"] for r in results),
        "message_deltas_per_run": statistics.median(r["deltas"] for r in results),
        "story_words": statistics.median(r["final_words"] for r in results),
        "events_total": total_events,
        "events_per_s_median": round(statistics.median(rates), 1),
        "events_per_s_overall": round(total_events / total_seconds, 1),
        "run_ms_median": round(statistics.median(run_seconds) * 1000, 3),
        "runs_per_s_median": round(1 / statistics.median(run_seconds), 2),
    }

    bare_rates = [count / seconds for count, seconds in bare]
    bare_seconds = [seconds for _, seconds in bare]
    bare_events = sum(count for count, _ in bare)
    bare_sdk = {
        "runs": runs,
        "events_per_run": statistics.median(count for count, _ in bare),
        "events_total": bare_events,
        "events_per_s_median": round(statistics.median(bare_rates), 1),
        "events_per_s_overall": round(bare_events / sum(bare_seconds), 1),
        "run_ms_median": round(statistics.median(bare_seconds) * 1000, 3),
        "runs_per_s_median": round(1 / statistics.median(bare_seconds), 2),
    }
    # Median of the per-pair ratios (each gateway run against the bare run right after it).
    pair_runs_ratio = statistics.median(
        b / g for g, b in zip(run_seconds, bare_seconds, strict=True)
    )

    def rung(seconds: list[float]) -> dict[str, Any]:
        return {
            "runs": runs,
            "run_ms_median": round(statistics.median(seconds) * 1000, 3),
            "runs_per_s_median": round(1 / statistics.median(seconds), 2),
        }

    def paired(faster: list[float], slower: list[float]) -> float:
        """Median of the per-pair ratios: how many of the slower runs' rate the faster's is."""
        return round(statistics.median(f / s for f, s in zip(faster, slower, strict=True)), 4)

    return {
        "input": STORY_INPUT,
        "gateway": gateway,
        "bare_sdk": bare_sdk,
        "sdk_with_session_and_checkpoint": rung(floor),
        "sdk_with_session_checkpoint_and_event_log": rung(logged),
        "note": (
            "gateway counts protocol events (run.started..run.completed); bare_sdk counts SDK "
            "stream events; only runs_per_s is like for like. sdk_with_session_and_checkpoint: "
            "the bare SDK run plus a thread, its session and the completion checkpoint's "
            "serialisation, in-process, nothing else stored or sent; "
            "sdk_with_session_checkpoint_and_event_log: that, plus every stream event "
            "translated and stored in the event log (no run row, nothing published or sent). "
            "Runs are interleaved."
        ),
        "ratio_gateway_over_bare": {
            "events_per_s": round(
                gateway["events_per_s_median"] / bare_sdk["events_per_s_median"], 4
            ),
            "runs_per_s": round(gateway["runs_per_s_median"] / bare_sdk["runs_per_s_median"], 4),
            "runs_per_s_paired_median": round(pair_runs_ratio, 4),
            # The best figure 1 a gateway with a session and a completion checkpoint could
            # reach: bare SDK over session + checkpoint, paired.
            "ceiling_with_session_and_checkpoint": paired(bare_seconds, floor),
            # ... and one that also stores every event before it is sent.
            "ceiling_with_event_log": paired(bare_seconds, logged),
            "gateway_over_session_and_checkpoint": paired(floor, run_seconds),
            "gateway_over_event_log": paired(logged, run_seconds),
        },
    }


def ts_gap(first: Frame, second: Frame) -> float:
    """Seconds between two events' server `ts` stamps."""
    parse = datetime.fromisoformat
    return (parse(second["ts"]) - parse(first["ts"])).total_seconds()


def is_tool_output(frame: Frame, call_id: str) -> bool:
    return (
        frame.get("type") == "event"
        and frame["event"] == "tool.output"
        and frame["data"].get("call_id") == call_id
    )


async def approval_runs(s: Session, runs: int) -> dict[str, list[float]]:
    """`runs` refund runs: each pauses for approval, a reviewer approves, the run completes."""
    samples: dict[str, list[float]] = {
        "tool_called_to_approval_requested": [],
        "approval_requested_to_run_paused": [],
        "decide_to_ack": [],
        "decide_to_approval_decided": [],
        "decide_to_run_resumed": [],
        # To the first event of the continuation a client sees work in: the approved call's
        # `tool.output` on the user connection.
        "decide_to_approved_tool_output": [],
        "run_start_to_run_started": [],
        # The same gaps by the events' own `ts` (server wall clock at event creation, 1 ms
        # resolution): what the server spends before the event exists, without delivery.
        "server_ts_tool_called_to_approval_requested": [],
        "server_ts_approval_decided_to_run_resumed": [],
        # From the tool call (the `ts` of `tool.called`: the server's wall clock when the SDK
        # handed the call over, truncated to the ms, so up to 1 ms high) to `approval.requested`
        # at the client (its arrival, on the same machine's wall clock). The client-side gap
        # above also moves with how fast `tool.called` itself was delivered.
        "tool_call_to_approval_requested_at_client": [],
    }
    # perf_counter stamps -> wall clock, to compare with the server's `ts`.
    wall_offset = time.time() - time.perf_counter()
    for _ in range(runs):
        s.user.forget()
        sent, _, ack = await s.user.request("run.start", input=REFUND_INPUT)
        run_id = ack["run_id"]
        paused_at, _ = await s.user.wait_event("run.paused", run_id)
        events = {f["event"]: (t, f) for t, f in s.user.run_events(run_id)}
        called_at = events["tool.called"][0]
        requested_at, requested = events["approval.requested"]
        samples["run_start_to_run_started"].append(events["run.started"][0] - sent)
        samples["tool_called_to_approval_requested"].append(requested_at - called_at)
        samples["approval_requested_to_run_paused"].append(paused_at - requested_at)
        samples["server_ts_tool_called_to_approval_requested"].append(
            ts_gap(events["tool.called"][1], requested)
        )
        called_ts = datetime.fromisoformat(events["tool.called"][1]["ts"]).timestamp()
        samples["tool_call_to_approval_requested_at_client"].append(
            requested_at + wall_offset - called_ts
        )

        mark = s.user.mark()
        decide_sent, ack_future = await s.reviewer.send(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        ack_at, decide_ack = await asyncio.wait_for(ack_future, TIMEOUT_S)
        if decide_ack["type"] != "ack":
            raise ProtocolError(f"approval.decide: {decide_ack}")
        decided_at, decided = await s.user.wait_event("approval.decided", run_id, mark)
        resumed_at, resumed = await s.user.wait_event("run.resumed", run_id, mark)
        output_at, _ = await s.user.wait_for(
            partial(is_tool_output, call_id=requested["data"]["call_id"]), mark
        )
        samples["decide_to_approved_tool_output"].append(output_at - decide_sent)
        samples["server_ts_approval_decided_to_run_resumed"].append(ts_gap(decided, resumed))
        samples["decide_to_ack"].append(ack_at - decide_sent)
        samples["decide_to_approval_decided"].append(decided_at - decide_sent)
        samples["decide_to_run_resumed"].append(resumed_at - decide_sent)
        await s.user.wait_event("run.completed", run_id, mark)
    return samples


async def start_latency(client: BenchClient, runs: int) -> dict[str, Any]:
    results = [await one_plain_run(client, START_INPUT) for _ in range(runs)]
    return {
        "input": START_INPUT,
        "run_start_to_run_started": latency_summary(
            [r["started_at"] - r["start_sent"] for r in results]
        ),
        "run_start_to_ack": latency_summary([r["ack_at"] - r["start_sent"] for r in results]),
        "run_start_to_run_completed": latency_summary(
            [r["completed_at"] - r["start_sent"] for r in results]
        ),
    }


async def benchmark(
    parts: tuple[str, ...], runs: int, story_runs: int, backend: Backend
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "benchmark": "bench.core",
        "backend": backend,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "parts": list(parts),
        "config": {
            "runs": runs,
            "story_runs": story_runs,
            "warmup_runs": WARMUP_RUNS,
            "demo_delay_ms": 0,
            "database": DATABASES[backend],
            "transport": "websockets client -> gateway subprocess on 127.0.0.1",
        },
        "machine": machine_info(),
    }
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        workdir = Path(tmp)
        async with fresh_database(backend, workdir) as database:
            with gateway_process(workdir, database=database) as gateway:
                async with session(gateway) as s:
                    # Warm-up: imports, database pages, SDK code paths on both branches.
                    for _ in range(WARMUP_RUNS):
                        await one_plain_run(s.user, STORY_INPUT)
                    await approval_runs(s, WARMUP_RUNS)

                    if "throughput" in parts:
                        report["throughput"] = await throughput(s.user, story_runs, backend)
                    if {"approval", "decision", "continuation"} & set(parts):
                        samples = await approval_runs(s, runs)
                        if "approval" in parts:
                            report["approval"] = {
                                "input": REFUND_INPUT,
                                "tool_called_to_approval_requested": latency_summary(
                                    samples["tool_called_to_approval_requested"]
                                ),
                                "approval_requested_to_run_paused": latency_summary(
                                    samples["approval_requested_to_run_paused"]
                                ),
                                "server_ts_tool_called_to_approval_requested": latency_summary(
                                    samples["server_ts_tool_called_to_approval_requested"]
                                ),
                                "tool_call_to_approval_requested_at_client": latency_summary(
                                    samples["tool_call_to_approval_requested_at_client"]
                                ),
                            }
                        if "decision" in parts:
                            report["decision"] = {
                                "input": REFUND_INPUT,
                                "decide_to_ack": latency_summary(samples["decide_to_ack"]),
                                "decide_to_approval_decided": latency_summary(
                                    samples["decide_to_approval_decided"]
                                ),
                                "decide_to_run_resumed": latency_summary(
                                    samples["decide_to_run_resumed"]
                                ),
                                "server_ts_approval_decided_to_run_resumed": latency_summary(
                                    samples["server_ts_approval_decided_to_run_resumed"]
                                ),
                            }
                        if "continuation" in parts:
                            report["continuation"] = {
                                "input": REFUND_INPUT,
                                "decide_to_approved_tool_output": latency_summary(
                                    samples["decide_to_approved_tool_output"]
                                ),
                                "decide_to_run_resumed": latency_summary(
                                    samples["decide_to_run_resumed"]
                                ),
                            }
                        if "start" in parts:
                            report["approval_runs_run_start_to_run_started"] = latency_summary(
                                samples["run_start_to_run_started"]
                            )
                    if "start" in parts:
                        report["start"] = await start_latency(s.user, runs)
    report["elapsed_s"] = round(time.perf_counter() - begin, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.core", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--runs", type=int, default=60, help="runs for each latency figure (default 60)"
    )
    parser.add_argument(
        "--story-runs", type=int, default=20, help="story runs for throughput (default 20)"
    )
    parser.add_argument("--only", choices=PARTS, help="run one part only")
    parser.add_argument(
        "--backend", choices=BACKENDS, default="sqlite", help="database backend (sqlite)"
    )
    parser.add_argument("--out", type=Path, help="also append the JSON line to this file")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.story_runs < 1:
        parser.error("--runs and --story-runs must be >= 1")
    parts = (args.only,) if args.only else PARTS
    report = asyncio.run(benchmark(parts, args.runs, args.story_runs, args.backend))
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
