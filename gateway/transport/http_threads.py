"""Threads over HTTP (docs/protocol.md §8 "Threads"): the caller's thread list, one thread, a
rename or an archive, and a deletion. The live list is gateway/transport/thread_list_feed.py."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.resources import Services
from gateway.run_lifecycle.thread_list import MAX_LIST
from gateway.transport.http_api import (
    JSONBody,
    authenticate,
    endpoint,
    int_param,
    method_route,
    path_id,
)
from gateway.transport.json_body import read_json_body

# `archived` in a list's query: which threads it holds.
ARCHIVED = {"false": False, "true": True}


def archived_param(request: Request) -> bool:
    raw = request.query_params.get("archived", "false")
    if raw not in ARCHIVED:
        raise GatewayError(ErrorCode.BAD_REQUEST, "archived must be true or false")
    return ARCHIVED[raw]


@endpoint
async def list_threads(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    limit = int_param(request, "limit", 100, low=1, high=MAX_LIST)
    archived = archived_param(request)
    views = await services.runs.thread_list.views(principal, archived=archived, limit=limit)
    return JSONBody({"threads": views})


@endpoint
async def get_thread(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    view = await services.runs.thread_list.view(principal, path_id(request, "thread_id"))
    return JSONBody({"thread": view})


@endpoint
async def change_thread(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    thread_id = path_id(request, "thread_id")
    body = await read_json_body(request)
    for name in ("title", "archived"):
        # Leave a field out to keep it: null is not a title, nor a yes or no.
        if name in body and body[name] is None:
            raise GatewayError(ErrorCode.BAD_REQUEST, f"{name} must not be null")
    view = await services.runs.thread_list.change(
        principal, thread_id, title=body.get("title"), archived=body.get("archived")
    )
    return JSONBody({"thread": view})


@endpoint
async def delete_thread(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    thread_id = path_id(request, "thread_id")
    return JSONBody(await services.runs.thread_list.delete(principal, thread_id))


def routes() -> list[Route]:
    return [
        Route("/v1/threads", list_threads, methods=["GET"]),
        method_route(
            "/v1/threads/{thread_id}", GET=get_thread, PATCH=change_thread, DELETE=delete_thread
        ),
    ]
