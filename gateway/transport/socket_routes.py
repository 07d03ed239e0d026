"""The gateway's Starlette application, its WebSocket routes served before the middleware
stack and the router.

A WebSocket's handler runs for as long as its connection stays open, and every layer it runs
under keeps a coroutine frame that long: Starlette's error and exception middleware, CORS, the
router and the route held 2.3 KiB of an idle connection's 26 (tracemalloc, 1,000 connections).
None of them acts on these sockets: the error middleware and CORS pass WebSockets through, the
endpoints close with their own codes rather than raising Starlette's exceptions, and the route
is matched here as the router matches it (under a mount's prefix too). Middleware added to the
application afterwards (`add_middleware`) is another stack, which WebSockets then go through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Match, WebSocketRoute
from starlette.types import Receive, Scope, Send


class SocketsFirst(Starlette):
    def __init__(self, *, routes: Sequence[BaseRoute], **options: Any) -> None:
        """Starlette's application; the `WebSocketRoute`s among `routes` are served first
        (they stay in the router as well, for `url_path_for`)."""
        super().__init__(routes=list(routes), **options)
        self._sockets = tuple(route for route in routes if isinstance(route, WebSocketRoute))
        self._middleware_built_in = len(self.user_middleware)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and len(self.user_middleware) == self._middleware_built_in:
            for route in self._sockets:
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    scope["app"] = self
                    scope.update(child_scope)
                    await route.app(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)
