"""Browser Origin check for the WebSocket upgrades (docs/protocol.md §3).

Non-browser clients send no Origin and are allowed: the check exists to stop other web pages
from driving a user's browser session, which bearer tokens alone do not prevent. Every
WebSocket endpoint (the native `/v1/ws`, the AI SDK's `/v1/ai-sdk/ws`) admits through one
`OriginGate`, so they take the same origins as CORS does and explain a refusal the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.requests import HTTPConnection
from starlette.websockets import WebSocket

from gateway.protocol.close_codes import CloseCode
from gateway.settings import Settings

log = logging.getLogger("gateway.websocket")

# Refused origins named in the log per process, at most: a hostile page cannot grow it.
MAX_REPORTED_ORIGINS = 64


class OriginGate:
    """Admits a WebSocket upgrade from the gateway's own origin, an allowed one or none;
    answers any other with HTTP 403."""

    def __init__(self) -> None:
        # The browser only sees a bare 403, so the log says why, once per origin: a page
        # reconnecting with back-off would otherwise repeat the same line forever.
        self._reported: set[str] = set()

    async def admit(self, websocket: WebSocket, settings: Settings) -> bool:
        if origin_allowed(websocket, settings.browser_origins()):
            return True
        self._report_refusal(websocket.headers.get("origin", ""))
        # Closing before accept makes the server answer the upgrade with HTTP 403.
        await websocket.close(code=CloseCode.UPGRADE_REFUSED)
        return False

    def _report_refusal(self, origin: str) -> None:
        if origin in self._reported or len(self._reported) >= MAX_REPORTED_ORIGINS:
            return
        self._reported.add(origin)
        log.warning(
            "refused a WebSocket from the page at origin %r (HTTP 403): only the gateway's own "
            "origin and those listed in GATEWAY_ALLOWED_ORIGINS (--allowed-origins) may connect;"
            " add it there to allow it",
            origin[:200],
        )


def origin_allowed(connection: HTTPConnection, allowed: Sequence[str]) -> bool:
    headers = connection.headers
    origin = headers.get("origin")
    if origin is None:
        return True
    origin = origin.rstrip("/").lower()
    # The connection's URL (parsed from the scope) only when the request has no Host.
    host = headers.get("host")
    host = (connection.url.netloc if host is None else host).lower()
    scheme = "https" if connection.scope["scheme"] in ("wss", "https") else "http"
    if origin == f"{scheme}://{host}":
        return True
    return origin in {item.lower() for item in allowed}
