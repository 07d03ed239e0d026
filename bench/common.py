"""What every benchmark part shares: statistics, a fresh database per backend, the gateway
subprocess, a timestamping client, the machine description, and the one-JSON-line report.

Nothing here is imported from `tests/`: the benchmarks must keep working when the test helpers
change shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import platform
import re
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, get_args

import orjson
import websockets
from sqlalchemy.engine import make_url
from websockets.asyncio.client import ClientConnection

from gateway.auth.access import TokenVerifier

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-secret-" + "b" * 51
TENANT = "bench"
TIMEOUT_S = 30.0
PORT_PATTERN = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")
# When set, gateway subprocesses run under cProfile and dump their profile into this folder
# on a clean stop (see docs/benchmarks.md, "Profiling").
PROFILE_DIR_ENV = "BENCH_PROFILE_DIR"
# When set, gateway subprocesses run with their event loop traced and write the trace into this
# folder on a clean stop (bench/traced_gateway.py, read by `python -m bench.loop_trace_summary`).
LOOP_TRACE_DIR_ENV = "BENCH_LOOP_TRACE_DIR"
# Each folder variable, with the script that wraps the gateway for it and its files' suffix.
# Both wrappers start recording on SIGUSR1, sent once the gateway listens.
GATEWAY_WRAPPERS = {
    PROFILE_DIR_ENV: ("profiled_gateway.py", "prof"),
    LOOP_TRACE_DIR_ENV: ("traced_gateway.py", "pickle"),
}
# When set, gateway subprocesses import the gateway from this source tree instead of this
# checkout: two versions can then be measured by the same benchmark code (before/after).
GATEWAY_ROOT_ENV = "BENCH_GATEWAY_ROOT"
# The PostgreSQL server the `postgresql` backend creates its databases on (and drops them from),
# given as the URL of a database to connect to for that (the maintenance database).
POSTGRES_URL_ENV = "BENCH_POSTGRES_URL"
POSTGRES_URL_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
POSTGRES_DATABASE_PREFIX = "bench_"

Backend = Literal["sqlite", "postgresql"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)

Frame = dict[str, Any]


# --------------------------------------------------------------------------------------------
# Statistics.
# --------------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, 'inclusive')."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * p / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency_summary(seconds: list[float]) -> dict[str, float | int]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3),
        "min_ms": round(min(ms), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


# --------------------------------------------------------------------------------------------
# The machine.
# --------------------------------------------------------------------------------------------


def cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "openai_agents": _version("openai-agents"),
        "websockets": _version("websockets"),
        "uvicorn": _version("uvicorn"),
        "uvloop": _version("uvloop"),
        "httptools": _version("httptools"),
        "starlette": _version("starlette"),
        "sqlalchemy": _version("sqlalchemy"),
        "aiosqlite": _version("aiosqlite"),
        "asyncpg": _version("asyncpg"),
        "orjson": _version("orjson"),
    }


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft open-files limit towards `wanted` (never above the hard limit).

    Child processes inherit it, so call this before spawning a server that must hold as many
    sockets as the benchmark opens. Returns the soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def rss_kib(pid: int) -> int:
    """Resident set size of a process (VmRSS from /proc, KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, all threads (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def process_tree_cpu_seconds(pid: int) -> float | None:
    """`process_cpu_seconds` of a process and all its descendants (a supervisor and its
    workers), as they are now."""
    total = process_cpu_seconds(pid)
    if total is None:
        return None
    try:
        children = [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
        ]
    except OSError:
        return total
    return total + sum(process_tree_cpu_seconds(child) or 0.0 for child in children)


def report_line(part: str, backend: str, figures: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The shape of every part's JSON line: what, on which database backend, when, on what
    machine, then the figures."""
    return {
        "part": part,
        "backend": backend,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        **figures,
        **extra,
        "machine": machine_info(),
    }


def emit(line: dict[str, Any], out: Path | None = None) -> None:
    text = orjson.dumps(line).decode()
    print(text, flush=True)
    if out is not None:
        with out.open("a") as handle:
            handle.write(text + "\n")


# --------------------------------------------------------------------------------------------
# Databases.
# --------------------------------------------------------------------------------------------


async def running_run_on_new_thread(store: Any, run_id: str) -> str:
    """A `running` run, with no lease yet, on a thread of its own in `store`: the thread id.
    For the parts that drive the Store alone (`bench.fenced_batch`, `bench.store_call`)."""
    from functools import partial

    from persistence.clock import utcnow
    from persistence.run_status import RunStatus
    from persistence.runs import RunRecord, RunRepository
    from persistence.threads import ThreadRepository

    thread = await ThreadRepository(store).create(tenant="bench", owner="alice")
    now = utcnow()
    record = RunRecord(
        run_id=run_id,
        thread_id=thread.thread_id,
        tenant="bench",
        owner="alice",
        status=RunStatus.RUNNING,
        agent="assistant",
        graph_version="1",
        on_disconnect="continue",
        input="hi",
        checkpoint_version=0,
        session_mark=0,
        error=None,
        created_at=now,
        updated_at=now,
    )
    await store.write(partial(RunRepository.insert_in, record=record))
    return thread.thread_id


def _postgres_admin_dsn() -> str:
    """The maintenance database's URL as asyncpg takes it (no SQLAlchemy driver suffix)."""
    url = make_url(os.environ.get(POSTGRES_URL_ENV) or POSTGRES_URL_DEFAULT)
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.asynccontextmanager
async def fresh_database(
    backend: Backend, workdir: Path, name: str = "gateway"
) -> AsyncIterator[str]:
    """The SQLAlchemy async URL of a new, empty database on `backend`, gone afterwards.

    `sqlite`: the file `workdir/<name>.db` (not created here; it goes with `workdir`).
    `postgresql`: a database `bench_<name>_<random>` created on the server of
    BENCH_POSTGRES_URL, dropped with `DROP DATABASE ... WITH (FORCE)` on the way out (so leave
    the block only once whatever used it has stopped). The gateway, `open_store` and
    `create_async_engine` all take the URL as it is.
    """
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{workdir / f'{name}.db'}"
        return
    import asyncpg

    database = f"{POSTGRES_DATABASE_PREFIX}{name}_{secrets.token_hex(4)}"
    admin = _postgres_admin_dsn()
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{database}"')
    finally:
        await conn.close()
    try:
        yield (
            make_url(admin)
            .set(drivername="postgresql+asyncpg", database=database)
            .render_as_string(hide_password=False)
        )
    finally:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await conn.close()


async def backend_info(backend: Backend) -> dict[str, Any]:
    """What a line says about its database beyond the backend's name: the server's version."""
    if backend == "sqlite":
        import sqlite3

        return {"sqlite_version": sqlite3.sqlite_version}
    import asyncpg

    conn = await asyncpg.connect(_postgres_admin_dsn())
    try:
        return {"postgresql_version": await conn.fetchval("SHOW server_version")}
    finally:
        await conn.close()


# --------------------------------------------------------------------------------------------
# Server subprocesses.
# --------------------------------------------------------------------------------------------


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    path: str = "/v1/ws"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{self.path}"

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


# Kept under its old name: bench.core's callers and docs know the gateway by it.
GatewayProcess = ServerProcess


@contextlib.contextmanager
def server_process(
    command: list[str],
    log_path: Path,
    env: dict[str, str],
    path: str = "/v1/ws",
    root: Path = ROOT,
) -> Iterator[ServerProcess]:
    """Start `command`, wait for uvicorn's "running on" line, stop it (SIGTERM) afterwards."""
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root), **env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    server: ServerProcess | None = None
    try:
        while server is None:
            match = PORT_PATTERN.search(log_path.read_text(errors="replace"))
            if match:
                server = ServerProcess(process, int(match.group(1)), log_path, path)
            elif process.poll() is not None:
                raise RuntimeError(f"{command} exited early:\n{log_path.read_text()}")
            elif time.monotonic() > deadline:
                raise TimeoutError(f"{command} did not start:\n{log_path.read_text()}")
            else:
                time.sleep(0.05)
        yield server
    finally:
        if server is not None:
            server.stop()
        elif process.poll() is None:
            process.kill()
            process.wait(10)


def gateway_command(name: str) -> list[str]:
    """`python -m gateway serve --port 0`, under cProfile when BENCH_PROFILE_DIR is set, its
    loop traced when BENCH_LOOP_TRACE_DIR is (`GATEWAY_WRAPPERS`)."""
    for variable, (script, suffix) in GATEWAY_WRAPPERS.items():
        folder = os.environ.get(variable)
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            stamp = datetime.now(UTC).strftime("%H%M%S")
            target = Path(folder) / f"{name}-{stamp}-{os.getpid()}.{suffix}"
            wrapper = Path(__file__).with_name(script)
            # -P: the wrapper's folder (bench/) stays off sys.path, where bench/ag_ui.py would
            # shadow the `ag_ui` package the gateway imports.
            return [sys.executable, "-P", str(wrapper), str(target), "serve", "--port", "0"]
    return [sys.executable, "-m", "gateway", "serve", "--port", "0"]


# Measure the gateway, not its abuse limits: one user starts runs back to back, and the memory
# part holds 2,000 connections, twice the default bound on open connections.
LIMITS_OFF = {
    "GATEWAY_FRAMES_PER_S": "0",
    "GATEWAY_RUNS_PER_MINUTE": "0",
    "GATEWAY_MAX_CONNECTIONS_PER_USER": "0",
    "GATEWAY_MAX_SUBSCRIPTIONS": "0",
    "GATEWAY_MAX_CONNECTIONS": "0",
}


@contextlib.contextmanager
def gateway_process(
    workdir: Path,
    *,
    database: str,
    demo_delay_ms: int = 0,
    env: dict[str, str] | None = None,
    name: str = "gateway",
    root: Path | None = None,
) -> Iterator[ServerProcess]:
    """`python -m gateway serve --port 0` on `database` (a URL from `fresh_database`); its log
    goes to `workdir/<name>.log`. The gateway of `root`'s tree (by default `BENCH_GATEWAY_ROOT`'s,
    or this checkout's)."""
    settings = {
        "GATEWAY_SECRET": SECRET,
        "GATEWAY_DEMO_DELAY_MS": str(demo_delay_ms),
        "GATEWAY_DATABASE_URL": database,
        **LIMITS_OFF,
        **(env or {}),
    }
    command = gateway_command(name)
    root = root or Path(os.environ.get(GATEWAY_ROOT_ENV) or ROOT)
    with server_process(command, workdir / f"{name}.log", settings, root=root) as server:
        if any(os.environ.get(variable) for variable in GATEWAY_WRAPPERS):
            server.process.send_signal(signal.SIGUSR1)  # start recording: start-up is over
        yield server


# --------------------------------------------------------------------------------------------
# A minimal timestamping protocol client.
# --------------------------------------------------------------------------------------------


class ProtocolError(RuntimeError):
    pass


def issue_token(user: str, roles: list[str]) -> str:
    return TokenVerifier(SECRET).issue(user, TENANT, roles)


# Whether the clients offer permessage-deflate (`python -m bench --compression`).
COMPRESSION_ENV = "BENCH_COMPRESSION"
COMPRESSION_CHOICES = ("off", "deflate")


def client_compression() -> Literal["deflate"] | None:
    """The `compression` argument of `websockets.connect` for a benchmark client: `deflate`
    offers permessage-deflate as browsers do (and as `websockets` does by default)."""
    return "deflate" if os.environ.get(COMPRESSION_ENV) == "deflate" else None


async def connect(url: str, token: str) -> ClientConnection:
    """Open a connection and authenticate it (hello -> welcome)."""
    ws = await websockets.connect(
        url, max_size=None, compression=client_compression(), ping_interval=None
    )
    await ws.send(orjson.dumps({"type": "hello", "protocol": 1, "token": token}).decode())
    welcome = orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
    if welcome.get("type") != "welcome":
        await ws.close()
        raise ProtocolError(f"no welcome: {welcome}")
    return ws


class BenchClient:
    """Reads every frame in a background task and stamps it with perf_counter on arrival."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[tuple[float, Frame]] = []
        self._acks: dict[str, asyncio.Future[tuple[float, Frame]]] = {}
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._closed = False
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, token: str) -> BenchClient:
        return cls(await connect(url, token))

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                now = time.perf_counter()
                frame = orjson.loads(raw)
                kind = frame.get("type")
                if kind == "ping":
                    await self.ws.send('{"type":"pong"}')
                    continue
                ref = frame.get("ref")
                if kind in ("ack", "error") and ref in self._acks:
                    self._acks.pop(ref).set_result((now, frame))
                    continue
                self.frames.append((now, frame))
                self._changed.set()
        except websockets.ConnectionClosed:
            pass
        finally:
            self._closed = True
            self._changed.set()
            for future in self._acks.values():
                if not future.done():
                    future.set_exception(ProtocolError("connection closed"))

    async def send(self, type_: str, **fields: Any) -> tuple[float, asyncio.Future[Any]]:
        """Send a request; returns its send time and a future of (arrival time, ack)."""
        ref = f"b{next(self._ids)}"
        future: asyncio.Future[tuple[float, Frame]] = asyncio.get_running_loop().create_future()
        self._acks[ref] = future
        data = orjson.dumps({"type": type_, "id": ref, **fields}).decode()
        sent = time.perf_counter()
        await self.ws.send(data)
        return sent, future

    async def request(self, type_: str, **fields: Any) -> tuple[float, float, Frame]:
        sent, future = await self.send(type_, **fields)
        arrived, frame = await asyncio.wait_for(future, TIMEOUT_S)
        if frame["type"] == "error":
            raise ProtocolError(f"{type_}: {frame.get('code')}: {frame.get('message')}")
        return sent, arrived, frame

    def mark(self) -> int:
        return len(self.frames)

    async def wait_for(
        self, predicate: Callable[[Frame], bool], since: int = 0
    ) -> tuple[float, Frame]:
        async def scan() -> tuple[float, Frame]:
            seen = since
            while True:
                for stamped in self.frames[seen:]:
                    if predicate(stamped[1]):
                        return stamped
                seen = len(self.frames)
                if self._closed:
                    raise ProtocolError("connection closed while waiting")
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(scan(), TIMEOUT_S)

    async def wait_event(self, name: str, run_id: str, since: int = 0) -> tuple[float, Frame]:
        return await self.wait_for(
            lambda f: f.get("type") == "event" and f["event"] == name and f["run_id"] == run_id,
            since,
        )

    def run_events(self, run_id: str, since: int = 0) -> list[tuple[float, Frame]]:
        return [
            (t, f)
            for t, f in self.frames[since:]
            if f.get("type") == "event" and f.get("run_id") == run_id
        ]

    def forget(self) -> None:
        """Drop the frames seen so far (call only between runs)."""
        self.frames.clear()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 5)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@contextlib.asynccontextmanager
async def clients(
    url: str, count: int, user: str = "alice"
) -> AsyncIterator[list[ClientConnection]]:
    """`count` authenticated connections, opened a few at a time, all closed afterwards."""
    token = issue_token(user, ["user"])
    opened: list[ClientConnection] = []
    try:
        for start in range(0, count, 50):
            batch = min(50, count - start)
            opened.extend(await asyncio.gather(*(connect(url, token) for _ in range(batch))))
        yield opened
    finally:
        await asyncio.gather(
            *(asyncio.wait_for(ws.close(), 10) for ws in opened), return_exceptions=True
        )


# --------------------------------------------------------------------------------------------
# A story run's protocol events, made without a gateway.
# --------------------------------------------------------------------------------------------

STORY_INPUT = "tell me a story"


async def story_events() -> list[tuple[str, dict[str, Any]]]:
    """(event type, data) of one demo story run, one `message.delta` per model delta.

    The demo model streamed in-process through the gateway's own translator: what the gateway
    logs for the run when nothing is merged, without storing or sending anything.
    """
    from agents import RunConfig, Runner

    from gateway.agents.demo.assistant import OfflineModelProvider, build_demo_agent
    from gateway.run_lifecycle.stream_translation import StreamTranslator

    agent = build_demo_agent()
    translator = StreamTranslator(agent=agent.name)
    events: list[tuple[str, dict[str, Any]]] = [
        ("run.started", {"input": STORY_INPUT, "agent": agent.name})
    ]
    result = Runner.run_streamed(
        agent,
        STORY_INPUT,
        run_config=RunConfig(model_provider=OfflineModelProvider(0), tracing_disabled=True),
    )
    async for sdk_event in result.stream_events():
        events.extend((str(type_), data) for type_, data in translator.translate(sdk_event))
    events.append(("run.completed", {"final_output": str(result.final_output)}))
    return events


def event_frame(thread_id: str, seq: int, run_id: str, type_: str, data: Any) -> str:
    """An `event` frame as the gateway encodes it (docs/protocol.md §5)."""
    return orjson.dumps(
        {
            "type": "event",
            "thread_id": thread_id,
            "seq": seq,
            "run_id": run_id,
            "event": type_,
            "ts": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            "data": data,
        }
    ).decode()
