"""The uvicorn server of a gateway: one configuration for `python -m gateway serve` and the
tests' in-process servers, so both run with the same protocols and limits.

The protocols are uvicorn's own, guarded (gateway/server/http_guard.py, gateway/server/ws_guard.py);
the limits come from the settings (gateway/server/connection_limits.py). The connection bound is
checked against the process's file-descriptor limit at start-up: a bound the process cannot hold
would let a flood of connections exhaust descriptors before it is reached, so it is lowered
to fit (with a warning) after trying to raise the soft limit to the hard one.
"""

from __future__ import annotations

import logging
import resource
import socket
from typing import Any, NoReturn

import uvicorn
from starlette.types import ASGIApp

from gateway.server.compression import Compression
from gateway.server.connection_limits import ServerLimits
from gateway.server.http_guard import GuardedH11Protocol, RequestHeadLimit
from gateway.server.lifespan import GatewayLifespan
from gateway.server.shared_frames import SharedFrames
from gateway.server.ws_guard import GuardedWebSocketProtocol
from gateway.settings import Settings

log = logging.getLogger("gateway.server")

# Descriptors kept for everything but client connections: the listener, the database files
# and their WAL and shared-memory files per connection, the event loop's own, log files,
# outbound connections (Redis, a JWKS, the model API).
RESERVED_DESCRIPTORS = 64


class GatewayConfig(uvicorn.Config):
    """uvicorn's configuration plus what the guarded protocols read from it: the limits, the
    compression the WebSocket connections negotiate and the frames they share
    (gateway/server/ws_guard.py)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limits: ServerLimits,
        compression: Compression | None = None,
        **kwargs: Any,
    ) -> None:
        # The gateway negotiates compression itself (gateway/server/compression.py).
        super().__init__(app, ws_per_message_deflate=False, **kwargs)
        self.limits = limits
        self.compression = compression or Compression()
        self.shared_frames = SharedFrames(self.compression)

    def load(self) -> None:
        super().load()
        if self.lifespan == "on":
            # A refused start-up is one error line (gateway/server/lifespan.py).
            self.lifespan_class = GatewayLifespan


def connection_bound(wanted: int, backlog: int) -> int:
    """The largest bound up to `wanted` that the descriptor limit can hold (0: unbounded,
    kept as it is). Up to `backlog` connections are accepted in one go (asyncio accepts that
    many at each wake-up) before the bound is applied to them: they need descriptors too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + RESERVED_DESCRIPTORS + backlog
    if wanted == 0 or soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if raised > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    fits = max(1, soft - RESERVED_DESCRIPTORS - backlog)
    if fits < wanted:
        log.warning(
            "GATEWAY_MAX_CONNECTIONS=%d does not fit the process's limit of %d open files: "
            "at most %d connections will be served (raise the limit, e.g. `ulimit -n`)",
            wanted,
            soft,
            fits,
        )
        return fits
    return wanted


def gateway_config(app: ASGIApp, settings: Settings, **overrides: Any) -> GatewayConfig:
    """The server configuration for `app`; `overrides` are further uvicorn options."""
    limits = ServerLimits.from_settings(
        settings, max_connections=connection_bound(settings.max_connections, settings.backlog)
    )
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": GuardedH11Protocol,
        "ws": GuardedWebSocketProtocol,
        # The frontend adapters' frames carry a whole conversation; the native endpoint checks
        # its own, smaller limit itself (gateway/transport/ws_connection.py).
        "ws_max_size": max(settings.max_frame_bytes, settings.frontend_body_bytes),
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "backlog": settings.backlog,
        "lifespan": "on",
        # Said, not guessed: uvicorn takes an application whose `__call__` is not a coroutine
        # function for ASGI 2, and RequestHeadLimit's returns the application's coroutine.
        "interface": "asgi3",
        "proxy_headers": True,
        "forwarded_allow_ips": settings.forwarded_allow_ips,
        "timeout_graceful_shutdown": 10,
        **overrides,
    }
    guarded = RequestHeadLimit(
        app, max_headers=settings.max_headers, max_bytes=settings.max_header_bytes
    )
    return GatewayConfig(
        guarded, limits=limits, compression=Compression.from_settings(settings), **options
    )


# uvicorn's exit status for a start-up that failed.
STARTUP_FAILURE = 3


def listening_socket(settings: Settings) -> socket.socket:
    """The port bound and listening before the application starts: a second copy of the
    gateway on a port already in use stops here, before its start-up has touched anything
    (recovering runs, claiming its instance id), and connections arriving during start-up wait
    in the backlog. Exits with one error line when the port cannot be bound."""
    try:
        return socket.create_server(
            (settings.host, settings.port),
            family=socket.AF_INET6 if ":" in settings.host else socket.AF_INET,
            backlog=settings.backlog,
        )
    except OSError as exc:
        refuse_port(settings, exc)


def refuse_port(settings: Settings, exc: OSError) -> NoReturn:
    """Exit with one error line saying the port cannot be had."""
    log.error(
        "not starting: cannot listen on %s port %d (%s): another process (another copy of "
        "the gateway?) holds it; stop it, or set GATEWAY_PORT (--port) to a free port",
        settings.host,
        settings.port,
        exc.strerror or exc,
    )
    raise SystemExit(STARTUP_FAILURE) from None


class GatewayServer(uvicorn.Server):
    """uvicorn's server on a socket bound beforehand (`listening_socket`), saying where it
    runs once it serves, as it does when it binds the port itself."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and sockets:
            self._log_started_message(sockets)
