"""Real gateways for tests: in-process uvicorn on an ephemeral port, or a subprocess to kill.

In-process servers let a test hand its own agent registry (ScriptedModel graphs) to the app;
subprocess servers are for crash tests (SIGKILL) and CLI behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from gateway.agents.registry import AgentRegistry
from gateway.app import create_app
from gateway.auth.access import TokenVerifier
from gateway.server.config import gateway_config
from gateway.settings import Settings, load_settings
from tests.support.fork_server import GatewayCommand, Process, gateway_command

TEST_SECRET = "test-secret-" + "x" * 52
# Abuse limits are off unless a test turns one on (tests/integration/test_limits.py): other
# tests open many sockets and start many runs as one user, faster than production allows.
NO_ABUSE_LIMITS: dict[str, Any] = {
    "frames_per_s": 0,
    "runs_per_minute": 0,
    "max_connections_per_user": 0,
    "max_subscriptions": 0,
    "max_pending_inputs": 0,
}
ROOT = Path(__file__).resolve().parents[2]
# How long a gateway may take to start before the test gives up on it: a wait, not a measured
# limit. Alone it starts in a second or two; on a 2-core machine running the suite on several
# workers, a fresh interpreter importing the SDK can take tens of seconds.
START_WITHIN_S = 90.0


@dataclass
class Gateway:
    port: int
    settings: Settings
    # The application, for a test that reaches the services its lifespan made.
    app: Starlette | None = None
    verifier: TokenVerifier = field(default_factory=lambda: TokenVerifier(TEST_SECRET))

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def token(self, user: str, *roles: str, tenant: str = "acme", ttl_s: int = 3600) -> str:
        return self.verifier.issue(user, tenant, roles or ("user",), ttl_s=ttl_s)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.http_url, timeout=10)


def database_url(database: Path | str) -> str:
    """A URL as it is, a path as the URL of that SQLite file."""
    return database if isinstance(database, str) and "://" in database else f"sqlite:///{database}"


def test_settings(database: Path | str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url(database),
        "secret": TEST_SECRET,
        "demo_delay_ms": 0,
        "heartbeat_s": 20.0,
        **NO_ABUSE_LIMITS,
    }
    values.update(overrides)
    return load_settings(**values)


@contextlib.asynccontextmanager
async def running_gateway(
    settings: Settings,
    registry: AgentRegistry | None = None,
    *,
    socket_sndbuf: int | None = None,
    tracer_provider: Any = None,
) -> AsyncIterator[Gateway]:
    """`socket_sndbuf` shrinks the kernel send buffer of accepted sockets (Linux inherits it
    from the listener), so a client that stops reading pushes back on the gateway quickly.
    `tracer_provider`: an OpenTelemetry provider the gateway records its spans with."""
    app = create_app(settings, registry=registry, tracer_provider=tracer_provider)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if socket_sndbuf is not None:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, socket_sndbuf)
    listener.bind(("127.0.0.1", 0))
    config = gateway_config(app, settings, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    deadline = time.monotonic() + START_WITHIN_S
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("gateway exited during start-up")
        if time.monotonic() > deadline:
            raise TimeoutError("gateway did not start")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Gateway(port=port, settings=settings, app=app)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


@dataclass
class GatewayProcess:
    process: Process
    port: int
    log_path: Path

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"


def spawn_gateway(
    workdir: Path,
    *,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    max_open_files: int | None = None,
    start_within_s: float = START_WITHIN_S,
) -> GatewayProcess:
    """`python -m gateway serve --port 0` in a subprocess (tests/support/fork_server.py);
    returns once it listens.
    `max_open_files`: the process's descriptor limit (soft and hard)."""
    log_path = workdir / f"gateway-{time.monotonic_ns()}.log"
    full_env = {
        **os.environ,
        "GATEWAY_DATABASE_URL": database_url(workdir / "gateway.db"),
        "GATEWAY_SECRET": TEST_SECRET,
        "GATEWAY_DEMO_DELAY_MS": "0",
        # A stable instance id: a restarted gateway takes its dead predecessor's runs over at
        # once instead of waiting for their leases to expire.
        "GATEWAY_INSTANCE_ID": "test-gateway",
        "PYTHONPATH": str(ROOT),
        **{f"GATEWAY_{name.upper()}": str(value) for name, value in NO_ABUSE_LIMITS.items()},
        **(env or {}),
    }
    log_path.touch()
    process = gateway_command(
        GatewayCommand(
            ["serve", "--port", "0", *(args or [])],
            full_env,
            ROOT,
            log_path,
            max_open_files=max_open_files,
        )
    )
    deadline = time.monotonic() + start_within_s
    pattern = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")
    while time.monotonic() < deadline:
        match = pattern.search(log_path.read_text(errors="replace"))
        if match:
            return GatewayProcess(process, int(match.group(1)), log_path)
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited early:\n{log_path.read_text()}")
        time.sleep(0.05)
    process.kill()
    raise TimeoutError(f"gateway did not start:\n{log_path.read_text()}")
