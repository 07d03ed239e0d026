"""Browser Origin check for the WebSocket upgrade (docs/protocol.md §3).

Non-browser clients send no Origin and are allowed: the check exists to stop other web pages
from driving a user's browser session, which bearer tokens alone do not prevent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from starlette.datastructures import URL


def origin_allowed(headers: Mapping[str, str], url: URL, allowed: Sequence[str]) -> bool:
    origin = headers.get("origin")
    if origin is None:
        return True
    origin = origin.rstrip("/").lower()
    host = headers.get("host", url.netloc).lower()
    scheme = "https" if url.scheme in ("wss", "https") else "http"
    if origin == f"{scheme}://{host}":
        return True
    return origin in {item.lower() for item in allowed}
