"""The limits a gateway's server applies to connections before they are of any use: how long
each phase may take, how large a request head may be, how many connections may be open.

Built once from the settings (`ServerLimits.from_settings`) and carried by the server's
configuration (gateway/server/config.py) to the HTTP and WebSocket protocols
(gateway/server/http_guard.py, gateway/server/ws_guard.py), which enforce them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from gateway.settings import Settings

log = logging.getLogger("gateway.server")

# How long a close frame may wait behind unread data before the connection is dropped
# (docs/protocol.md §7, close codes).
CLOSE_TIMEOUT_S = 10.0
# A flood of refused connections is reported at most this often.
REFUSAL_REPORT_EVERY_S = 60.0


@dataclass
class Refusals:
    """Connections refused for the connection bound, reported as one warning per interval
    rather than one line each: a flood must not become a flood of log lines."""

    refused: int = 0
    _reported_at: float = field(default=-REFUSAL_REPORT_EVERY_S)

    def note(self, open_connections: int, limit: int) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._reported_at >= REFUSAL_REPORT_EVERY_S:
            log.warning(
                "connection limit reached (%d open, GATEWAY_MAX_CONNECTIONS=%d): refused %d "
                "connection(s) since the last report",
                open_connections,
                limit,
                self.refused,
            )
            self._reported_at = now
            self.refused = 0


@dataclass
class ServerLimits:
    # A connection that has sent nothing yet (new, or between two requests) is closed then.
    idle_timeout_s: float
    # From the connection's first byte (or the end of the previous response) to a complete
    # request head: bounds a head sent a byte at a time.
    header_timeout_s: float
    # From a complete head to the end of its body, whether the application reads it or not.
    body_timeout_s: float
    max_header_bytes: int
    max_headers: int
    # Open connections, HTTP and WebSocket together; 0: no bound.
    max_connections: int
    close_timeout_s: float = CLOSE_TIMEOUT_S
    refusals: Refusals = field(default_factory=Refusals)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, max_connections: int | None = None
    ) -> ServerLimits:
        return cls(
            idle_timeout_s=settings.idle_timeout_s,
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            max_connections=(
                settings.max_connections if max_connections is None else max_connections
            ),
        )
