"""Durability benchmarks: what a turn checkpoint costs, and how fast a killed gateway recovers.

    .venv/bin/python -m bench.durability [--runs 100] [--connections 10] [--reps 15]
                                         [--conversation-runs 20] [--delay-ms 50]
                                         [--delay-before-kill-ms 200] [--out FILE]

Part 1 (`checkpoint_size`) runs in-process with the SDK and no gateway: the demo agent on the
offline model, a `RunState` taken with `result.to_state()` at every `tool_output` stream event
(the gateway's turn boundary), serialised both ways side by side: the SDK's own
`state.to_string()` (`json.dumps(..., indent=2)`) and the gateway's compact form
(`orjson.dumps(state.to_json()).decode()`, gateway/run_lifecycle/execution.py). `stored_checkpoints`
reads the `checkpoints` table of a real gateway's SQLite file (sqlite3, read-only) after tool runs.

Part 2 (`recovery`) drives gateway subprocesses (`python -m gateway serve --port 0`, a fixed
GATEWAY_INSTANCE_ID so a restart takes the dead process's runs over at once) on one SQLite file:

1. start `--runs` story runs over `--connections` WebSocket connections, wait until every run
   streams, SIGKILL the gateway;
2. restart it with a model so slow that recovered runs stay idle, only to time the recovery
   work itself from the `run.recovered` events' `ts`; SIGKILL it once it listens;
3. the measured restart: process start -> "Uvicorn running", -> the first `run.recovered` at a
   client that subscribes to one thread as soon as the port is known, -> every run's
   `run.recovered` at clients subscribed to all the threads; then wait for the runs to end;
4. a restart with nothing to recover (for comparison), which then serves the tool runs whose
   checkpoints `stored_checkpoints` reads.

Log lines of every gateway are stamped as they arrive on its stdout pipe. One JSON line is
printed to stdout (and written to --out). See docs/benchmarks.md ("Durability").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import websockets
from websockets.asyncio.client import ClientConnection

from bench.common import LIMITS_OFF, emit, fresh_database
from bench.core import ROOT, SECRET, TENANT, latency_summary, machine_info
from gateway.auth.access import TokenVerifier

INSTANCE_ID = "bench-durability"
STORY_INPUT = "tell me a story"
STATUS_INPUT = "status of 1, 2, 3, 4 and 5"
FOLLOW_UPS = 4  # extra single-lookup runs on the stored-checkpoint thread
TIMEOUT_S = 60.0
COMPLETION_TIMEOUT_S = 120.0
# A restart recovers every run before it listens: allow for a slow, shared machine.
START_TIMEOUT_S = 180.0
# The demo model pace of the "recovery only" restart: recovered runs sit in their first delta.
IDLE_DELAY_MS = 10_000
TERMINAL = ("run.completed", "run.failed", "run.cancelled")
# Gateway log lines that mark the phases of a start (uvicorn's and the gateway's own).
LOG_MARKS = {
    "started_server_process": "Started server process",
    "application_startup_begins": "Waiting for application startup",
    "recovered_log_line": "left active by a previous process",
    "gateway_ready": "gateway ready",
    "application_startup_complete": "Application startup complete",
    "uvicorn_running": "Uvicorn running on",
}
PORT_PATTERN = re.compile(rb"Uvicorn running on http://127\.0\.0\.1:(\d+)")

Frame = dict[str, Any]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def median_ms(samples: list[float]) -> float:
    return ms(statistics.median(samples))


# --------------------------------------------------------------------------------------------
# Part 1: checkpoint size and serialisation time per turn boundary, in-process.
# --------------------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> float:
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def measure_boundary(state: Any, reps: int) -> dict[str, Any]:
    """Both serialisations of one RunState, `reps` times each, alternating which goes first."""
    sdk_text = state.to_string()
    compact_text = orjson.dumps(state.to_json()).decode()
    if json.loads(sdk_text) != orjson.loads(compact_text):
        raise AssertionError("the two serialisations disagree")

    def sdk() -> Any:
        return state.to_string()

    def compact() -> Any:
        return orjson.dumps(state.to_json()).decode()

    gc.collect()
    sdk_s: list[float] = []
    compact_s: list[float] = []
    for rep in range(reps):
        if rep % 2 == 0:
            sdk_s.append(_timed(sdk))
            compact_s.append(_timed(compact))
        else:
            compact_s.append(_timed(compact))
            sdk_s.append(_timed(sdk))
    # Where the time goes: building the dict (shared by both) vs encoding it.
    to_json_s: list[float] = []
    indent_s: list[float] = []
    orjson_s: list[float] = []
    for _ in range(reps):
        begin = time.perf_counter()
        tree = state.to_json()
        to_json_s.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        json.dumps(tree, indent=2)
        indent_s.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        orjson.dumps(tree).decode()
        orjson_s.append(time.perf_counter() - begin)
    sdk_bytes = len(sdk_text.encode())
    compact_bytes = len(compact_text.encode())
    sdk_ms, compact_ms = median_ms(sdk_s), median_ms(compact_s)
    return {
        "sdk_bytes": sdk_bytes,
        "compact_bytes": compact_bytes,
        "size_ratio": round(compact_bytes / sdk_bytes, 4),
        "sdk_ms": sdk_ms,
        "compact_ms": compact_ms,
        "time_ratio": round(
            statistics.median(c / s for c, s in zip(compact_s, sdk_s, strict=True)), 4
        ),
        "to_json_ms": median_ms(to_json_s),
        "json_indent_encode_ms": median_ms(indent_s),
        "orjson_encode_ms": median_ms(orjson_s),
    }


async def boundaries_of_run(
    agent: Any, text: str, run_config: Any, reps: int, session: Any = None
) -> list[dict[str, Any]]:
    """Stream one run; measure a `to_state()` at every `tool_output` event."""
    from agents import RunItemStreamEvent, Runner

    rows: list[dict[str, Any]] = []
    result = Runner.run_streamed(agent, text, run_config=run_config, session=session)
    async for event in result.stream_events():
        if isinstance(event, RunItemStreamEvent) and event.name == "tool_output":
            begin = time.perf_counter()
            state = result.to_state()
            to_state_s = time.perf_counter() - begin
            rows.append({**measure_boundary(state, reps), "to_state_ms": ms(to_state_s)})
    return rows


def summarise_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def span(key: str) -> list[float]:
        return [min(r[key] for r in rows), max(r[key] for r in rows)]

    return {
        "boundaries": len(rows),
        "size_ratio_median": round(statistics.median(r["size_ratio"] for r in rows), 4),
        "time_ratio_median": round(statistics.median(r["time_ratio"] for r in rows), 4),
        **{
            f"{key}_range": span(key)
            for key in (
                "sdk_bytes",
                "compact_bytes",
                "sdk_ms",
                "compact_ms",
                "to_json_ms",
                "json_indent_encode_ms",
                "orjson_encode_ms",
                "to_state_ms",
            )
        },
    }


async def checkpoint_sizes(database: str, reps: int, conversation_runs: int) -> dict[str, Any]:
    """Part 1; the growing conversation's session lives in `database` (a SQLAlchemy async URL
    from `bench.common.fresh_database`)."""
    from agents import RunConfig
    from agents.extensions.memory import SQLAlchemySession
    from sqlalchemy.ext.asyncio import create_async_engine

    from gateway.agents import identity_shortcut
    from gateway.agents.demo.assistant import OfflineModelProvider, build_demo_agent

    # Both forms serialised as in a gateway's process, whichever part ran first in this one.
    identity_shortcut.install()
    agent = build_demo_agent()
    run_config = RunConfig(model_provider=OfflineModelProvider(0), tracing_disabled=True)
    await boundaries_of_run(agent, STATUS_INPUT, run_config, 1)  # warm-up, not reported

    five = [
        {"boundary": number, **row}
        for number, row in enumerate(
            await boundaries_of_run(agent, STATUS_INPUT, run_config, reps), 1
        )
    ]

    engine = create_async_engine(database)
    session = SQLAlchemySession("bench-conversation", engine=engine, create_tables=True)
    growing: list[dict[str, Any]] = []
    try:
        for run in range(1, conversation_runs + 1):
            text = f"status of {run}"
            for row in await boundaries_of_run(agent, text, run_config, reps, session=session):
                growing.append({"run": run, **row})
    finally:
        await engine.dispose()
    return {
        "method": (
            "in-process, demo agent on OfflineModelProvider(0); result.to_state() at every "
            "tool_output event; sdk = state.to_string() (json.dumps indent=2), compact = "
            "orjson.dumps(state.to_json()).decode() (what the gateway stores), both with "
            "the agents ranked as in a gateway (gateway/agents/identity_shortcut.py); times "
            f"are medians of {reps} alternating side-by-side repetitions"
        ),
        "reps": reps,
        "five_tool_turns": {"input": STATUS_INPUT, "summary": summarise_rows(five), "rows": five},
        "growing_conversation": {
            "input": f"status of N, run N = 1..{conversation_runs} on one SQLAlchemySession",
            "runs": conversation_runs,
            "summary": summarise_rows(growing),
            "rows": growing,
        },
    }


# --------------------------------------------------------------------------------------------
# Gateway subprocesses whose log lines are stamped on arrival.
# --------------------------------------------------------------------------------------------


@dataclass
class Gateway:
    name: str
    process: subprocess.Popen[bytes]
    started: float  # perf_counter just before Popen
    started_wall: float  # time.time() at the same moment
    log_path: Path
    lines: list[tuple[float, str]] = field(default_factory=list)
    port: int | None = None
    cpu_at_listening: float | None = None  # the process's CPU seconds when it listened
    _port_ready: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: threading.Thread | None = None

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    async def wait_listening(self, timeout: float = START_TIMEOUT_S) -> int:
        deadline = time.monotonic() + timeout
        while not self._port_ready.is_set():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.log_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not start:\n{self.log_text()}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._port_ready.wait(), 0.25)
        assert self.port is not None
        return self.port

    def mark(self, needle: str) -> float | None:
        """Seconds from process start to the first log line containing `needle`."""
        return next((t - self.started for t, line in self.lines if needle in line), None)

    def start_phases(self) -> dict[str, float | None]:
        phases: dict[str, float | None] = {}
        for key, needle in LOG_MARKS.items():
            at = self.mark(needle)
            phases[f"to_{key}_ms"] = ms(at) if at is not None else None
        listening = self.mark(LOG_MARKS["uvicorn_running"])
        cpu = self.cpu_at_listening
        phases["cpu_s_until_listening"] = round(cpu, 2) if cpu is not None else None
        phases["cpu_share_until_listening"] = (
            round(cpu / listening, 3) if cpu is not None and listening else None
        )
        return phases

    def log_text(self) -> str:
        return "\n".join(line for _, line in self.lines)[-6000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        if self._reader is not None:
            self._reader.join(5)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._reader is not None:
            self._reader.join(5)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, all threads (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def spawn_gateway(workdir: Path, name: str, delay_ms: int) -> Gateway:
    """`python -m gateway serve --port 0` on workdir/gateway.db; returns at once."""
    env = {
        **os.environ,
        "GATEWAY_SECRET": SECRET,
        "GATEWAY_DEMO_DELAY_MS": str(delay_ms),
        "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{workdir / 'gateway.db'}",
        # Stable: a restarted gateway takes its dead predecessor's runs over at once instead
        # of waiting for their leases to expire.
        "GATEWAY_INSTANCE_ID": INSTANCE_ID,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        **LIMITS_OFF,
    }
    loop = asyncio.get_running_loop()
    started_wall = time.time()
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    gateway = Gateway(name, process, started, started_wall, workdir / f"{name}.log")

    def read() -> None:
        assert process.stdout is not None
        with gateway.log_path.open("wb") as log_file:
            for raw in iter(process.stdout.readline, b""):
                now = time.perf_counter()
                gateway.lines.append((now, raw.decode(errors="replace").rstrip()))
                log_file.write(raw)
                if gateway.port is None and (match := PORT_PATTERN.search(raw)):
                    gateway.cpu_at_listening = process_cpu_seconds(process.pid)
                    gateway.port = int(match.group(1))
                    loop.call_soon_threadsafe(gateway._port_ready.set)

    gateway._reader = threading.Thread(target=read, name=f"{name}-log", daemon=True)
    gateway._reader.start()
    return gateway


# --------------------------------------------------------------------------------------------
# A protocol client that remembers the first arrival of each (run, event).
# --------------------------------------------------------------------------------------------


class ProtocolError(RuntimeError):
    pass


@dataclass
class Tracker:
    """Shared by a phase's connections: first arrival per (run_id, event), per-run counts."""

    first: dict[tuple[str, str], tuple[float, Frame]] = field(default_factory=dict)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    last_seq: dict[str, int] = field(default_factory=dict)
    _waiters: dict[tuple[str, str], list[asyncio.Future[None]]] = field(default_factory=dict)

    def saw(self, now: float, frame: Frame) -> None:
        key = (frame.get("run_id") or "", frame["event"])
        self.counts[key] = self.counts.get(key, 0) + 1
        thread_id = frame["thread_id"]
        self.last_seq[thread_id] = max(self.last_seq.get(thread_id, 0), frame["seq"])
        if key not in self.first:
            self.first[key] = (now, frame)
            for future in self._waiters.pop(key, []):
                if not future.done():
                    future.set_result(None)

    async def wait(self, run_id: str, *events: str, timeout: float = TIMEOUT_S) -> str:
        """Wait for the first of `events` for the run; returns which one."""
        for event in events:
            if (run_id, event) in self.first:
                return event
        loop = asyncio.get_running_loop()
        futures = {event: loop.create_future() for event in events}
        for event, future in futures.items():
            self._waiters.setdefault((run_id, event), []).append(future)
        try:
            done, _ = await asyncio.wait(
                futures.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for future in futures.values():
                future.cancel()
        if not done:
            raise TimeoutError(f"run {run_id}: none of {events} within {timeout} s")
        return next(event for event, future in futures.items() if future in done)


class Client:
    def __init__(self, ws: ClientConnection, tracker: Tracker) -> None:
        self.ws = ws
        self.tracker = tracker
        self._acks: dict[str, asyncio.Future[Frame]] = {}
        self._ids = itertools.count(1)
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, token: str, tracker: Tracker) -> Client:
        ws = await websockets.connect(url, max_size=None, compression=None)
        await ws.send(orjson.dumps({"type": "hello", "protocol": 1, "token": token}).decode())
        welcome = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
        if welcome.get("type") != "welcome":
            await ws.close()
            raise ProtocolError(f"no welcome: {welcome}")
        return cls(ws, tracker)

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                now = time.perf_counter()
                frame = orjson.loads(raw)
                kind = frame.get("type")
                if kind == "ping":
                    await self.ws.send('{"type":"pong"}')
                elif kind == "event":
                    self.tracker.saw(now, frame)
                elif kind in ("ack", "error") and frame.get("ref") in self._acks:
                    self._acks.pop(frame["ref"]).set_result(frame)
        except websockets.ConnectionClosed:
            pass
        finally:
            for future in self._acks.values():
                if not future.done():
                    future.set_exception(ProtocolError("connection closed"))

    async def request(self, type_: str, **fields: Any) -> Frame:
        ref = f"d{next(self._ids)}"
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._acks[ref] = future
        await self.ws.send(orjson.dumps({"type": type_, "id": ref, **fields}).decode())
        frame = await asyncio.wait_for(future, TIMEOUT_S)
        if frame["type"] == "error":
            raise ProtocolError(f"{type_}: {frame.get('code')}: {frame.get('message')}")
        return frame

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 5)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


async def close_all(clients: list[Client]) -> None:
    await asyncio.gather(*(c.close() for c in clients))
    clients.clear()


def token() -> str:
    return TokenVerifier(SECRET).issue("alice", TENANT, ["user"])


def server_offset(frame: Frame, wall0: float) -> float:
    """Seconds from `wall0` (a time.time()) to an event's own `ts` (server clock, 1 ms)."""
    return datetime.fromisoformat(frame["ts"].replace("Z", "+00:00")).timestamp() - wall0


# --------------------------------------------------------------------------------------------
# Part 2: recovery of interrupted runs.
# --------------------------------------------------------------------------------------------


@dataclass
class Interrupted:
    thread_id: str
    run_id: str


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def ts_seconds(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def read_only(db_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)


def head_seqs(db_path: Path) -> dict[str, int]:
    connection = read_only(db_path)
    try:
        return dict(connection.execute("SELECT thread_id, max(seq) FROM events GROUP BY thread_id"))
    finally:
        connection.close()


def recovered_offsets(db_path: Path, gateway: Gateway) -> list[float]:
    """Seconds from the gateway's process start to each `run.recovered` it wrote (server ts)."""
    connection = read_only(db_path)
    try:
        stamps = [
            ts_seconds(row[0])
            for row in connection.execute("SELECT ts FROM events WHERE type = 'run.recovered'")
        ]
    finally:
        connection.close()
    # 1 ms slack: `ts` is truncated to the millisecond.
    return sorted(s - gateway.started_wall for s in stamps if s >= gateway.started_wall - 0.001)


def recovery_spacing(offsets: list[float]) -> dict[str, Any]:
    """How the server spaced the `run.recovered` events of one start (from their `ts`)."""
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(offsets)]
    return {
        "recovered": len(offsets),
        "server_ts_first_run_recovered_ms": round(offsets[0] * 1000) if offsets else None,
        "server_ts_last_run_recovered_ms": round(offsets[-1] * 1000) if offsets else None,
        "server_ts_gap_ms": latency_summary([g / 1000 for g in gaps]) if gaps else None,
        "server_ts_gap_first_10_median_ms": round(statistics.median(gaps[:10])) if gaps else None,
        "server_ts_gap_last_10_median_ms": round(statistics.median(gaps[-10:])) if gaps else None,
    }


async def start_story_runs(gateway: Gateway, runs: int, connections: int) -> dict[str, Any]:
    """`runs` story runs on fresh threads over `connections` sockets; wait until all stream."""
    tracker = Tracker()
    clients = [await Client.connect(gateway.ws_url, token(), tracker) for _ in range(connections)]
    begin = time.perf_counter()
    acks = await asyncio.gather(
        *(clients[i % connections].request("run.start", input=STORY_INPUT) for i in range(runs))
    )
    acked = time.perf_counter()
    started = [Interrupted(a["thread_id"], a["run_id"]) for a in acks]
    await asyncio.gather(*(tracker.wait(r.run_id, "message.delta", *TERMINAL) for r in started))
    streaming = time.perf_counter()
    return {
        "tracker": tracker,
        "clients": clients,
        "runs": started,
        "all_acked_s": round(acked - begin, 3),
        "all_streaming_s": round(streaming - begin, 3),
    }


async def measured_restart(
    workdir: Path,
    delay_ms: int,
    connections: int,
    interrupted: list[Interrupted],
) -> tuple[Gateway, dict[str, Any]]:
    """Start the gateway on the crashed database; time the recovery as clients see it."""
    after_seq = head_seqs(workdir / "gateway.db")
    tracker = Tracker()
    clients: list[Client] = []
    gateway = spawn_gateway(workdir, "gateway-restart", delay_ms)
    try:
        await gateway.wait_listening()
        t0 = gateway.started
        # One client subscribes to the first thread as soon as the port is known.
        probe_run = interrupted[0]
        probe = await Client.connect(gateway.ws_url, token(), tracker)
        clients.append(probe)
        probe_connected = time.perf_counter()
        await probe.request(
            "thread.subscribe",
            thread_id=probe_run.thread_id,
            after_seq=after_seq.get(probe_run.thread_id, 0),
        )
        probe_subscribed = time.perf_counter()
        await tracker.wait(probe_run.run_id, "run.recovered")
        probe_recovered = tracker.first[(probe_run.run_id, "run.recovered")][0]

        # Then every thread, spread over `connections` more sockets.
        others = [
            await Client.connect(gateway.ws_url, token(), tracker) for _ in range(connections)
        ]
        clients.extend(others)
        await asyncio.gather(
            *(
                others[i % connections].request(
                    "thread.subscribe",
                    thread_id=r.thread_id,
                    after_seq=after_seq.get(r.thread_id, 0),
                )
                for i, r in enumerate(interrupted[1:])
            )
        )
        all_subscribed = time.perf_counter()
        await asyncio.gather(*(tracker.wait(r.run_id, "run.recovered") for r in interrupted))
        recovered = [tracker.first[(r.run_id, "run.recovered")] for r in interrupted]
        all_recovered = max(t for t, _ in recovered)

        outcomes = await asyncio.gather(
            *(tracker.wait(r.run_id, *TERMINAL, timeout=COMPLETION_TIMEOUT_S) for r in interrupted),
            return_exceptions=True,
        )
        await close_all(clients)
    finally:
        await close_all(clients)
        gateway.stop()

    versions: dict[str, int] = {}
    for _, frame in recovered:
        version = str(frame["data"].get("checkpoint_version"))
        versions[version] = versions.get(version, 0) + 1
    # Server-side run times from the events' own `ts`: clients subscribe only once the gateway
    # listens, so early runs may already be over when their events reach a client.
    wall0 = gateway.started_wall
    run_seconds: list[float] = []
    ended_at: list[float] = []
    words: list[int] = []
    for run, outcome in zip(interrupted, outcomes, strict=True):
        if not isinstance(outcome, str):
            continue
        end = tracker.first[(run.run_id, outcome)][1]
        begin = tracker.first[(run.run_id, "run.recovered")][1]
        run_seconds.append(ts_seconds(end["ts"]) - ts_seconds(begin["ts"]))
        ended_at.append(ts_seconds(end["ts"]) - wall0)
        if outcome == "run.completed":
            words.append(len(str(end["data"]["final_output"]).split()))
    phases = gateway.start_phases()
    return gateway, {
        **phases,
        "a_start_to_uvicorn_running_ms": phases["to_uvicorn_running_ms"],
        "probe_connected_ms": ms(probe_connected - t0),
        "probe_subscribed_ms": ms(probe_subscribed - t0),
        "b_start_to_first_run_recovered_at_client_ms": ms(probe_recovered - t0),
        "all_subscribed_ms": ms(all_subscribed - t0),
        "c_start_to_all_run_recovered_at_clients_ms": ms(all_recovered - t0),
        **recovery_spacing(sorted(server_offset(f, wall0) for _, f in recovered)),
        "run_recovered_checkpoint_versions": versions,
        "message_aborted_events": sum(
            tracker.counts.get((r.run_id, "message.aborted"), 0) for r in interrupted
        ),
        "after_restart": {
            "completed": sum(1 for o in outcomes if o == "run.completed"),
            "failed": sum(1 for o in outcomes if o == "run.failed"),
            "cancelled": sum(1 for o in outcomes if o == "run.cancelled"),
            "not_finished": sum(1 for o in outcomes if not isinstance(o, str)),
            "wait_limit_s": COMPLETION_TIMEOUT_S,
            "server_ts_start_to_last_run_ended_s": round(max(ended_at), 3) if ended_at else None,
            "server_ts_run_recovered_to_run_end": latency_summary(run_seconds)
            if run_seconds
            else None,
            "story_words_median": statistics.median(words) if words else None,
        },
    }


async def recovery(
    workdir: Path, runs: int, connections: int, delay_ms: int, delay_before_ms: int
) -> dict[str, Any]:
    db_path = workdir / "gateway.db"
    # 1. Start `runs` story runs and crash while all of them stream.
    first = spawn_gateway(workdir, "gateway-1", delay_before_ms)
    try:
        await first.wait_listening()
        before = await start_story_runs(first, runs, connections)
        first.kill()
        tracker: Tracker = before["tracker"]
        await close_all(before["clients"])
    finally:
        first.kill()
    started: list[Interrupted] = before["runs"]
    ended_early = {
        r.run_id for r in started if any((r.run_id, e) in tracker.first for e in TERMINAL)
    }
    interrupted = [r for r in started if r.run_id not in ended_early]
    if not interrupted:
        raise RuntimeError("every run ended before the kill; raise --delay-before-kill-ms")
    deltas = [tracker.counts.get((r.run_id, "message.delta"), 0) for r in interrupted]

    # 2. Recovery alone: restart with a model so slow that recovered runs stay idle (no
    #    streaming competes with the recovery loop), and crash again once it listens.
    idle = spawn_gateway(workdir, "gateway-idle", IDLE_DELAY_MS)
    try:
        await idle.wait_listening()
    finally:
        idle.kill()
    idle_result = {
        "demo_delay_ms": IDLE_DELAY_MS,
        **idle.start_phases(),
        **recovery_spacing(recovered_offsets(db_path, idle)),
    }

    # 3. The measured restart: recovered runs stream at `delay_ms` while recovery goes on.
    _, restart = await measured_restart(workdir, delay_ms, connections, interrupted)

    # 4. A restart with nothing to recover, then the stored-checkpoint runs.
    quiet = spawn_gateway(workdir, "gateway-quiet", 0)
    try:
        await quiet.wait_listening()
        quiet_phases = quiet.start_phases()
        stored = await stored_checkpoint_runs(quiet)
    finally:
        quiet.stop()

    return {
        "result": {
            "runs": len(started),
            "interrupted": len(interrupted),
            "ended_before_kill": len(ended_early),
            "connections": connections,
            "input": STORY_INPUT,
            "demo_delay_ms_before_kill": delay_before_ms,
            "demo_delay_ms_after_restart": delay_ms,
            "before_kill": {
                "all_acked_s": before["all_acked_s"],
                "all_streaming_s": before["all_streaming_s"],
                "message_deltas_per_run_at_kill": spread(deltas),
            },
            "restart": restart,
            "recovery_only_idle_runs": idle_result,
            "start_fresh_db": first.start_phases(),
            "start_nothing_to_recover": quiet_phases,
        },
        "stored": stored,
        "story_run_ids": [r.run_id for r in started],
    }


async def stored_checkpoint_runs(gateway: Gateway) -> dict[str, Any]:
    """A five-turn status run, then FOLLOW_UPS single lookups on the same thread."""
    tracker = Tracker()
    client = await Client.connect(gateway.ws_url, token(), tracker)
    try:
        ack = await client.request("run.start", input=STATUS_INPUT)
        thread_id, run_ids = ack["thread_id"], [ack["run_id"]]
        await tracker.wait(ack["run_id"], *TERMINAL)
        for number in range(6, 6 + FOLLOW_UPS):
            ack = await client.request(
                "run.start", thread_id=thread_id, input=f"status of {number}"
            )
            run_ids.append(ack["run_id"])
            await tracker.wait(ack["run_id"], *TERMINAL)
    finally:
        await client.close()
    return {"thread_id": thread_id, "run_ids": run_ids}


def read_checkpoints(
    db_path: Path, stored: dict[str, Any], story_run_ids: list[str]
) -> dict[str, Any]:
    """The stored checkpoint rows, read with sqlite3 in read-only mode."""
    connection = read_only(db_path)
    try:
        columns = [row[1] for row in connection.execute("PRAGMA table_info(checkpoints)")]
        row_bytes = " + ".join(f"coalesce(length(CAST({c} AS BLOB)), 0)" for c in columns)
        rows = []
        for run_number, run_id in enumerate(stored["run_ids"], 1):
            for version, reason, state_bytes, total in connection.execute(
                f"SELECT version, reason, length(CAST(state AS BLOB)), {row_bytes} "
                "FROM checkpoints WHERE run_id = ? ORDER BY version",
                (run_id,),
            ):
                rows.append(
                    {
                        "run": run_number,
                        "version": version,
                        "reason": reason,
                        "state_bytes": state_bytes,
                        "row_bytes": total,
                    }
                )
        marks = ",".join("?" * len(story_run_ids))
        story_checkpoints = connection.execute(
            f"SELECT count(*) FROM checkpoints WHERE run_id IN ({marks})", story_run_ids
        ).fetchone()[0]
        table_rows, table_bytes = connection.execute(
            "SELECT count(*), coalesce(sum(length(CAST(state AS BLOB))), 0) FROM checkpoints"
        ).fetchone()
    finally:
        connection.close()
    return {
        "method": (
            f"gateway subprocess: run 1 = '{STATUS_INPUT}', runs 2..{1 + FOLLOW_UPS} = "
            "'status of N' on the same thread; checkpoints table read with sqlite3 (mode=ro); "
            "row_bytes = sum of every column's byte length (no SQLite page overhead)"
        ),
        "rows": rows,
        "story_run_checkpoints": story_checkpoints,
        "table_rows": table_rows,
        "table_state_bytes": table_bytes,
    }


# --------------------------------------------------------------------------------------------


async def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {
        "benchmark": "bench.durability",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": {
            "runs": args.runs,
            "connections": args.connections,
            "reps": args.reps,
            "conversation_runs": args.conversation_runs,
            "demo_delay_ms": args.delay_ms,
            "demo_delay_ms_before_kill": args.delay_before_kill_ms,
            "instance_id": INSTANCE_ID,
            "database": "sqlite+aiosqlite (fresh file in a temp dir)",
            "transport": "websockets client -> gateway subprocess on 127.0.0.1",
        },
        "machine": {**machine_info(), "loadavg_at_start": list(os.getloadavg())},
    }
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gateway-durability-") as tmp:
        workdir = Path(tmp)
        # Part 2 reads the gateway's SQLite file directly (sqlite3): SQLite only, part 1 too.
        async with fresh_database("sqlite", workdir, "conversation") as database:
            report["checkpoint_size"] = await checkpoint_sizes(
                database, args.reps, args.conversation_runs
            )
        outcome = await recovery(
            workdir, args.runs, args.connections, args.delay_ms, args.delay_before_kill_ms
        )
        report["stored_checkpoints"] = read_checkpoints(
            workdir / "gateway.db", outcome["stored"], outcome["story_run_ids"]
        )
        report["recovery"] = outcome["result"]
    report["machine"]["loadavg_at_end"] = list(os.getloadavg())
    report["elapsed_s"] = round(time.perf_counter() - begin, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.durability", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=100, help="interrupted runs (default 100)")
    parser.add_argument(
        "--connections", type=int, default=10, help="WebSocket connections (default 10)"
    )
    parser.add_argument(
        "--reps", type=int, default=15, help="repetitions per serialisation (default 15)"
    )
    parser.add_argument(
        "--conversation-runs", type=int, default=20, help="runs in the growing conversation"
    )
    parser.add_argument(
        "--delay-ms",
        type=int,
        default=50,
        help="GATEWAY_DEMO_DELAY_MS of the measured restart (default 50)",
    )
    parser.add_argument(
        "--delay-before-kill-ms",
        type=int,
        default=200,
        help="GATEWAY_DEMO_DELAY_MS before the crash, so no run ends first (default 200)",
    )
    parser.add_argument("--out", type=Path, help="also append the JSON line to this file")
    args = parser.parse_args(argv)
    if min(args.runs, args.connections, args.reps, args.conversation_runs) < 1:
        parser.error("--runs, --connections, --reps and --conversation-runs must be >= 1")
    report = asyncio.run(benchmark(args))
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
