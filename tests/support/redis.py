"""Redis for the relay's tests: the machine's server, or one of a test's own to stop and start.

The machine's Redis is `GATEWAY_TEST_REDIS_URL` (default redis://127.0.0.1:6379/0); each test
uses a channel prefix of its own (`bus_prefix`), and pub/sub leaves nothing behind. A test that
takes Redis away mid-run starts its own `redis-server` on a free port instead. Without a
reachable server (or the binary) the test skips, or fails under GATEWAY_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import REQUIRE_SERVICES, require_service
from tests.support.ports import free_port
from tests.support.workers import worker_id

SERVER_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def require_redis() -> str:
    url = make_url(SERVER_URL)
    require_service("Redis", url.host or "127.0.0.1", url.port or 6379)
    return SERVER_URL


def bus_prefix() -> str:
    """A prefix of the test's own: its worker's name keeps workers apart however the random
    part falls, and says whose keys a leftover is."""
    return f"gwtest-{worker_id()}-{secrets.token_hex(6)}"


class RedisServer:
    """A `redis-server` of the test's own, in memory only, that can be stopped and restarted
    on the same port."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            message = "redis-server is not installed"
            if REQUIRE_SERVICES:
                pytest.fail(message + " (GATEWAY_REQUIRE_SERVICES=1)")
            pytest.skip(message)
        self._binary = binary
        self._workdir = workdir
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self._process = subprocess.Popen(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("redis-server did not start")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
        self._process = None
