"""Browser Origin check for the WebSocket upgrade (docs/protocol.md §3).

Non-browser clients send no Origin and are allowed: the check exists to stop other web pages
from driving a user's browser session, which bearer tokens alone do not prevent.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import HTTPConnection


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
