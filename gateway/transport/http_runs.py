"""Starting runs and sending input over HTTP (docs/protocol.md §8): `run.start` and `run.input`
for clients without a WebSocket.

A body is the frame without its `type` and `id`, validated by the frame parser itself, and
served by the same RunManager calls with the same run-start limit, so the rules, limits and
error codes are the WebSocket's. What the run then does is read from the thread's event log
(`GET /v1/threads/{thread_id}/stream` or `/events`).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.protocol import frames as protocol
from gateway.protocol.error_codes import ErrorCode, GatewayError
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.transport.http_api import JSONBody, authenticate, endpoint, path_id
from gateway.transport.json_body import read_json_body

# Fields a WebSocket frame has that an HTTP body must not carry: the kind is the route's, a
# request id is what the HTTP exchange already is.
FRAME_ONLY = ("type", "id")


def _admit(services: Services, principal: Principal) -> Any:
    def admit() -> None:
        services.limits.admit_run_start(principal.tenant, principal.user)

    return admit


@endpoint
async def start_run(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    frame = await _validated(services, "run.start", await read_json_body(request))
    if frame.on_disconnect != "continue":
        # An HTTP caller holds no connection whose loss could suspend the run.
        raise GatewayError(ErrorCode.BAD_REQUEST, "on_disconnect must be 'continue' over HTTP")
    started = await services.runs.start_run(
        principal,
        thread_id=frame.thread_id,
        text=frame.input,
        agent=frame.agent,
        on_disconnect="continue",
        admit=_admit(services, principal),
    )
    return JSONBody(
        {
            "thread_id": started.thread_id,
            "run_id": started.run_id,
            "epoch": started.thread.epoch,
            "first_seq": started.first_seq,
        }
    )


@endpoint
async def send_input(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    frame = await _thread_frame(request, services, "run.input")
    result = await services.runs.submit_input(
        principal,
        frame.thread_id,
        frame.input,
        admit=_admit(services, principal),
        max_pending=services.limits.pending_inputs_per_thread,
    )
    return JSONBody(result)


@endpoint
async def regenerate(request: Request, services: Services) -> Response:
    """`run.regenerate` over HTTP: a new answer to the thread's last input (or to `input`)."""
    principal = await authenticate(request, services)
    frame = await _thread_frame(request, services, "run.regenerate")
    started = await services.runs.regenerate(
        principal,
        frame.thread_id,
        text=frame.input,
        supersedes=frame.run_id,
        admit=_admit(services, principal),
    )
    return JSONBody({**started.answer(), "first_seq": started.first_seq})


@endpoint
async def retry(request: Request, services: Services) -> Response:
    """`run.retry` over HTTP: the failed run, retried from its last checkpoint in a new run.
    The path says everything: a body, if any, is not read."""
    principal = await authenticate(request, services)
    frame = await _validated(services, "run.retry", {"run_id": path_id(request, "run_id")})
    admit = _admit(services, principal)
    started = await services.runs.retries.retry(principal, frame.run_id, admit=lambda _: admit())
    return JSONBody({**started.answer(), "first_seq": started.first_seq})


async def _thread_frame(request: Request, services: Services, kind: str) -> Any:
    """The body as the frame `kind` about the path's thread (`thread_id` is the path's)."""
    body = await read_json_body(request)
    if "thread_id" in body:
        raise GatewayError(ErrorCode.BAD_REQUEST, "thread_id is the path's, not a body field")
    return await _validated(services, kind, {**body, "thread_id": path_id(request, "thread_id")})


async def _validated(services: Services, kind: str, body: dict[str, Any]) -> Any:
    """The body as the frame `kind`, through the WebSocket's frame parser."""
    for name in FRAME_ONLY:
        if name in body:
            raise GatewayError(ErrorCode.BAD_REQUEST, f"{name} is not a field of this body")
    # A refused body raises `ProtocolError`, a `GatewayError` the endpoint answers like any.
    return protocol.parse_client_frame(
        orjson.dumps({"type": kind, **body}),
        max_input_chars=services.settings.max_input_chars,
    )
