"""Serve the API documents: `GET /v1/openapi.json` and `GET /v1/asyncapi.json`, no auth.

Each document is built and encoded once per app: it depends only on the code, never on the
settings, so what is served is byte-for-byte what docs/ holds (a test compares).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.specs.asyncapi import asyncapi_document
from gateway.specs.openapi import ASYNCAPI_PATH, OPENAPI_PATH, openapi_document


def _serve(document: dict[str, Any]) -> Callable[[Request], Awaitable[Response]]:
    body = orjson.dumps(document)

    async def handler(request: Request) -> Response:
        return Response(body, media_type="application/json")

    return handler


def routes() -> list[Route]:
    return [
        Route(OPENAPI_PATH, _serve(openapi_document()), methods=["GET"]),
        Route(ASYNCAPI_PATH, _serve(asyncapi_document()), methods=["GET"]),
    ]
