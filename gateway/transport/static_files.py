"""The browser demo as static files, served with strict security headers.

The page loads only its own scripts and styles and talks only to its own origin, so the
Content-Security-Policy can forbid everything else; `frame-ancestors` (which a <meta> tag
cannot set) keeps other sites from framing the reviewer's approve button.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Mapping
from pathlib import Path

from starlette.datastructures import MutableHeaders
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PERMISSIONS_POLICY = (
    "accelerometer=(), autoplay=(), camera=(), display-capture=(), fullscreen=(), "
    "geolocation=(), gyroscope=(), magnetometer=(), microphone=(), midi=(), payment=(), "
    "publickey-credentials-get=(), usb=()"
)
HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    # For browsers that predate `frame-ancestors`.
    "x-frame-options": "DENY",
    # The page opens no other windows and is embedded nowhere: isolate it from both.
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    # It uses no device or payment feature, so a script injected despite the CSP gets none.
    "permissions-policy": PERMISSIONS_POLICY,
    # Revalidate on every load, so an upgrade never leaves old modules in a browser cache.
    "cache-control": "no-cache",
}


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


def demo_app(
    directory: Path,
    *,
    packages: Mapping[str, Path] | None = None,
    pages: Mapping[str, Path] | None = None,
) -> ASGIApp:
    """The demo's files; `packages` maps a path prefix (e.g. "/js/gateway-client") to another
    directory served under it as it is, with no index page (the client package's modules);
    `pages` likewise, with the directory's index.html at the prefix (a built example app)."""
    # Browsers refuse ES modules served as text/plain, which some hosts' MIME tables produce.
    mimetypes.add_type("text/javascript", ".js")
    mimetypes.add_type("image/svg+xml", ".svg")
    demo = SecurityHeaders(StaticFiles(directory=directory, html=True))
    mounted = [
        (prefix.rstrip("/"), SecurityHeaders(StaticFiles(directory=path, html=html)))
        for mounts, html in ((packages, False), (pages, True))
        for prefix, path in (mounts or {}).items()
    ]
    if not mounted:
        return demo

    async def files(scope: Scope, receive: Receive, send: Send) -> None:
        root = scope.get("root_path", "")
        path = scope["path"][len(root) :] if scope["path"].startswith(root) else scope["path"]
        for prefix, app in mounted:
            # The prefix alone reaches the mount too: a page's StaticFiles redirects it to
            # prefix + "/" (its index), a package's answers 404 as before.
            if path == prefix or path.startswith(prefix + "/"):
                # As a Mount would: StaticFiles resolves the path below the root path.
                await app({**scope, "root_path": root + prefix}, receive, send)
                return
        await demo(scope, receive, send)

    return files


# What static files can be asked for; any other method on a path no route claims is the
# router's 404 (static files would answer 405, as if the path existed).
READ_METHODS = frozenset({"GET", "HEAD"})


def demo_fallback(demo: ASGIApp, otherwise: ASGIApp) -> ASGIApp:
    """`demo` for GET and HEAD requests no route claims; `otherwise` (the router's own 404, or
    its close for a WebSocket) for anything else, which static files cannot serve."""

    async def fallback(scope: Scope, receive: Receive, send: Send) -> None:
        reads = scope["type"] == "http" and scope["method"] in READ_METHODS
        await (demo if reads else otherwise)(scope, receive, send)

    return fallback
