"""Fixtures of the hostile-traffic suite: gateway subprocesses, so what an attack costs the
server can be read from /proc without the test's own memory and sockets in the figures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.gateway import GatewayProcess, spawn_gateway


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """`spawn(env={...}, max_open_files=N)`: a gateway subprocess on the test's SQLite file,
    stopped at teardown."""
    started: list[GatewayProcess] = []

    def start(**kwargs: object) -> GatewayProcess:
        process = spawn_gateway(tmp_path, **kwargs)  # type: ignore[arg-type]
        started.append(process)
        return process

    yield start
    for process in started:
        process.terminate()
