"""GET /metrics on a listener of its own (`GATEWAY_METRICS_PORT`), for deployments that keep
the scrape off the port clients reach: the same route, in a small application of its own,
served by a second uvicorn server on the gateway's event loop (docs/operations.md "Metrics").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator, Sequence

import uvicorn
from starlette.applications import Starlette

from gateway.observability.metrics_endpoint import metrics_route
from gateway.resources import Services

log = logging.getLogger(__name__)

STARTED_WITHIN_S = 10.0


class _SideServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The gateway's own server handles SIGTERM and SIGINT; this one stops with its lifespan.
        yield

    def _log_started_message(self, listeners: Sequence[socket.SocketType]) -> None:
        # "Uvicorn running on ..." names the gateway's own port; `MetricsServer.start` logs
        # this listener's.
        pass


class MetricsServer:
    def __init__(self, services: Services, host: str, port: int) -> None:
        app = Starlette(routes=[metrics_route()])
        app.state.services = services
        config = uvicorn.Config(
            app, host=host, port=port, lifespan="off", log_config=None, access_log=False
        )
        self._server = _SideServer(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(), name="metrics-server")
        deadline = asyncio.get_running_loop().time() + STARTED_WITHIN_S
        while not self._server.started:
            if self._task.done():
                self._task.result()  # the listener could not be opened: say why
                raise RuntimeError("the metrics listener stopped during start-up")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("the metrics listener did not start")
            await asyncio.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        log.info("metrics at http://%s:%d/metrics", host, port)

    async def close(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await self._task
