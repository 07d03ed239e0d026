"""AG-UI over HTTP (docs/protocol.md §12): run, connect and stop, and the same three under
CopilotKit's runtime paths.

- `POST /v1/ag-ui/{graph}` takes a `RunAgentInput`: the newest user message starts a run on the
  conversation `threadId` names, or `resume` decides the approvals of its interrupts; the answer
  streams that AG-UI run. Everything that can be refused is refused before the stream starts.
- `POST /v1/ag-ui/{graph}/connect` streams the conversation from a cursor (`Last-Event-ID`, or
  `forwardedProps.lastEventId`): the log's tail from a run boundary, or, from the middle of a
  run, a prelude that re-opens it as it stood; then live, until the thread is quiet. With
  nothing to send, 200 and an empty body.
- `POST /v1/ag-ui/{graph}/stop/{thread_id}` cancels the conversation's run.

Each stored event gives zero or more AG-UI events (`events.ThreadProjection`), written as
LF-framed SSE messages whose `id:` is the stored event's seq, so a client's last id is its
cursor. The stream is a view: a client that leaves stops nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.frontends import conversation
from gateway.frontends.ag_ui import copilotkit
from gateway.frontends.ag_ui.events import TERMINAL, Event, Pause, ThreadProjection
from gateway.frontends.ag_ui.run_input import RunRequest, cursor_of, parse_run_input
from gateway.frontends.thread_log import LogEntry, follow, read_span
from gateway.protocol.error_codes import ErrorCode, GatewayError, conflict, not_found
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.storage.health import StorageUnavailable
from gateway.transport.feed_response import MEDIA_TYPE, FeedResponse
from gateway.transport.http_api import JSONBody, authenticate, endpoint, path_id
from gateway.transport.json_body import read_json_body
from gateway.transport.sse import HEARTBEAT

# A run that waits for decisions, or for a watcher, streams nothing until someone acts.
WAITING = frozenset({"waiting_for_review", "suspended"})

# Whether a stream ends after the stored event of this seq; the flag: that event ended an
# AG-UI run.
Done = Callable[[int, bool], Awaitable[bool]]


def routes() -> list[Route]:
    """AG-UI's endpoints, and the same under CopilotKit's runtime paths (`copilotkit.py`)."""
    ck = copilotkit.PREFIX
    return [
        Route("/v1/ag-ui/{graph}", run_agent, methods=["POST"]),
        Route("/v1/ag-ui/{graph}/connect", connect_agent, methods=["POST"]),
        Route("/v1/ag-ui/{graph}/stop/{thread_id}", stop_run, methods=["POST"]),
        Route(ck, copilotkit_single_route, methods=["POST"]),
        Route(f"{ck}/info", copilotkit_info, methods=["GET"]),
        Route(f"{ck}/agent/{{graph}}/run", run_agent, methods=["POST"]),
        Route(f"{ck}/agent/{{graph}}/connect", connect_agent, methods=["POST"]),
        Route(f"{ck}/agent/{{graph}}/stop/{{thread_id}}", stop_run, methods=["POST"]),
    ]


# -- the endpoints ----------------------------------------------------------------------------


@endpoint
async def run_agent(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    graph = _graph_of(services, request.path_params["graph"])
    return await _run(services, principal, graph, await _body(request, services))


@endpoint
async def connect_agent(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    graph = _graph_of(services, request.path_params["graph"])
    body = await _body(request, services)
    return await _connect(services, principal, graph, body, request.headers.get("last-event-id"))


@endpoint
async def stop_run(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    _graph_of(services, request.path_params["graph"])
    thread_id = conversation.conversation_id(path_id(request, "thread_id"), "threadId")
    await _body(request, services)
    return await _stop(services, principal, thread_id)


@endpoint
async def copilotkit_info(request: Request, services: Services) -> Response:
    await authenticate(request, services)
    return JSONBody(copilotkit.runtime_info(services))


@endpoint
async def copilotkit_single_route(request: Request, services: Services) -> Response:
    """CopilotKit's single-route transport: one POST whose envelope names the operation."""
    principal = await authenticate(request, services)
    envelope = copilotkit.single_route_request(await _body(request, services))
    if envelope.method == "info":
        return JSONBody(copilotkit.runtime_info(services))
    graph = _graph_of(services, envelope.agent_id)
    if envelope.method == "agent/run":
        return await _run(services, principal, graph, envelope.body)
    if envelope.method == "agent/connect":
        header = request.headers.get("last-event-id")
        return await _connect(services, principal, graph, envelope.body, header)
    thread_id = conversation.conversation_id(envelope.thread_id, "params.threadId")
    return await _stop(services, principal, thread_id)


# -- the operations ---------------------------------------------------------------------------


async def _run(
    services: Services, principal: Principal, graph: str, body: dict[str, Any]
) -> Response:
    """A new message starts a run, or `resume` decides the newest pause; the AG-UI run that
    follows is streamed."""
    run = parse_run_input(body)
    thread = await conversation.existing_thread(services, principal, run.thread_id)
    head = 0 if thread is None else thread.head_seq
    projection = await _projection(services, principal, run, upto=head)
    # Taken before anything changes: a caller over its connection limit starts nothing.
    slot = services.limits.open_connection(principal.tenant, principal.user)
    try:
        if run.resume is not None:
            cursor, projection = await _resume(services, principal, run, projection)
        else:
            cursor = await _start(services, principal, run, projection, graph)
            await _catch_up(services, principal, projection, upto=cursor)
    except BaseException:
        slot.release()
        raise
    projection.name_next_run(run.run_id)

    async def one_run(_seq: int, ended: bool) -> bool:
        return ended

    stream = _stream(services, principal, projection, [], one_run)
    return FeedResponse(stream, slot, services=services, principal=principal)


async def _connect(
    services: Services,
    principal: Principal,
    graph: str,
    body: dict[str, Any],
    last_event_id: str | None,
) -> Response:
    """The conversation from the cursor, then live until the thread is quiet."""
    run = parse_run_input(body)
    cursor = cursor_of(last_event_id, run.forwarded_props)
    thread = await conversation.existing_thread(services, principal, run.thread_id)
    if thread is None:
        if cursor:
            raise not_found("thread not found")
        return _nothing()
    if cursor > thread.head_seq:
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"Last-Event-ID {cursor} is past the thread's newest event ({thread.head_seq})",
        )
    projection = await _projection(services, principal, run, upto=cursor)

    async def quiet(seq: int, _ended: bool = False) -> bool:
        """Nothing more to stream for now: the log ends here and no run is streaming."""
        if seq < thread.head_seq:
            return False  # the log went on past it already
        _, active = await conversation.watched_thread(services, principal, run.thread_id)
        if active is not None and active.status not in WAITING:
            return False
        fresh = await conversation.existing_thread(services, principal, run.thread_id)
        return fresh is None or seq >= fresh.head_seq

    if projection.run is None and await quiet(cursor):
        return _nothing()
    slot = services.limits.open_connection(principal.tenant, principal.user)
    prelude = projection.prelude()
    stream = _stream(services, principal, projection, prelude, quiet)
    return FeedResponse(stream, slot, services=services, principal=principal)


async def _stop(services: Services, principal: Principal, thread_id: str) -> Response:
    """Cancels the conversation's active run, wherever it streams. CopilotKit sends the
    `runId` it knows, but a conversation has one active run at most, so it is not needed."""
    stopped = await conversation.stop(services, principal, thread_id)
    return JSONBody({"stopped": stopped is not None})


async def _body(request: Request, services: Services) -> dict[str, Any]:
    return await read_json_body(request, max_bytes=services.settings.frontend_body_bytes)


def _graph_of(services: Services, name: Any) -> str:
    graph = str(name)
    if graph not in services.registry.names():
        raise not_found(f"no agent named {graph!r}")
    return graph


async def _projection(
    services: Services, principal: Principal, run: RunRequest, *, upto: int
) -> ThreadProjection:
    projection = ThreadProjection(run.thread_id, run.dialect)
    await _catch_up(services, principal, projection, upto=upto)
    return projection


async def _catch_up(
    services: Services, principal: Principal, projection: ThreadProjection, *, upto: int
) -> None:
    """Feed the projection the stored events up to `upto` (their output is not sent)."""
    if projection.seq >= upto:
        return
    for entry in await read_span(services, principal, projection.thread_id, projection.seq, upto):
        projection.apply(entry)


async def _start(
    services: Services,
    principal: Principal,
    run: RunRequest,
    projection: ThreadProjection,
    graph: str,
) -> int:
    """Start a run with the newest user message; the seq the stream follows from."""
    pause = projection.pause
    if pause is not None and pause.open_ids:
        raise conflict(
            f"the conversation waits for {len(pause.open_ids)} decision(s): answer its "
            "interrupts with `resume`"
        )
    active = await services.runs.active_run(run.thread_id)
    if active is not None:
        # The native protocol would stage or queue the input; an AG-UI client follows one
        # run at a time.
        raise conflict(
            "the conversation has a run in progress: follow it with connect, or stop it first"
        )
    new = run.newest_user
    if new is None:
        raise GatewayError(ErrorCode.BAD_REQUEST, "messages has no user message to answer")
    if new.message_id in projection.user_message_ids:
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            "the newest user message is already in the conversation: send a new one",
        )
    started = await conversation.start_turn(
        services, principal, run.thread_id, new.text, agent=graph
    )
    return started.first_seq - 1


async def _resume(
    services: Services,
    principal: Principal,
    run: RunRequest,
    projection: ThreadProjection,
    *,
    again: bool = True,
) -> tuple[int, ThreadProjection]:
    """Decide the newest pause's approvals as `resume` answers them. An answer that repeats
    the decision already stored is harmless: with nothing left to decide, the continuation is
    streamed again from the pause; one that differs is refused."""
    assert run.resume is not None
    pause = projection.pause
    voided = projection.voided
    if pause is None and voided is not None and _abandons(run.resume, voided):
        # A client that did not see the cancel still holds the void interrupts, and can only
        # answer them. Abandoning them changes nothing: the short run that voided them is
        # streamed again, which clears them.
        return voided.seq, await _projection(services, principal, run, upto=voided.seq)
    if pause is None:
        raise conflict("the conversation has no open interrupt to resume")
    answered = {d.approval_id for d in run.resume}
    for decision in run.resume:
        if decision.approval_id not in pause.interrupts:
            raise not_found(f"interrupt {decision.approval_id} is not open on this conversation")
    missing = [i for i in pause.open_ids if i not in answered]
    if missing:
        raise GatewayError(
            ErrorCode.BAD_REQUEST,
            f"resume must answer every open interrupt; missing: {', '.join(missing)}",
        )
    await conversation.check_repeated(
        services, principal, [d for d in run.resume if d.approval_id in pause.decisions]
    )
    fresh = [d for d in run.resume if d.approval_id not in pause.decisions]
    if not fresh:
        return pause.seq, await _projection(services, principal, run, upto=pause.seq)
    try:
        await conversation.decide_all(services, principal, fresh)
    except GatewayError as exc:
        if exc.code is not ErrorCode.CONFLICT or not again:
            raise
        # Settled meanwhile: the same answer from another request, or an expiry the refusal
        # just recorded. Looked at again, once, the answer may repeat what is stored now.
        thread = await conversation.existing_thread(services, principal, run.thread_id)
        head = projection.seq if thread is None else thread.head_seq
        await _catch_up(services, principal, projection, upto=head)
        return await _resume(services, principal, run, projection, again=False)
    return projection.seq, projection


def _abandons(answers: list[conversation.Decision], voided: Pause) -> bool:
    """Whether `answers` only abandon (`cancelled`) interrupts of the void pause."""
    return bool(answers) and all(
        answer.abandoned and answer.approval_id in voided.interrupts for answer in answers
    )


# -- the stream -------------------------------------------------------------------------------


def _nothing() -> Response:
    # 200 with an empty body: `@ag-ui/client` takes a 204 (no body) for a broken stream.
    return Response(b"", media_type=MEDIA_TYPE, headers={"cache-control": "no-store"})


def _frame(seq: int, event: Event) -> bytes:
    # LF framing only: `@ag-ui/client` splits messages on a blank line of "\n\n".
    return b"id: %d\ndata: %s\n\n" % (seq, orjson.dumps(event))


async def _stream(
    services: Services,
    principal: Principal,
    projection: ThreadProjection,
    prelude: list[Event],
    done: Done,
) -> AsyncIterator[bytes]:
    """The prelude, then each stored event's AG-UI events as one write (so a cut falls
    between stored events), until `done` says so. It is asked between AG-UI runs: after a
    run's end, and after each stored event that follows it with no AG-UI event (a decision
    made elsewhere after a pause); asked only after the end, a connect whose log ends with
    such an event would never end."""
    cursor = projection.seq
    if prelude:
        yield b"".join(_frame(cursor, event) for event in prelude)
    entries = follow(services, principal, projection.thread_id, cursor)
    try:
        async for entry in _paced(services, entries):
            if entry is None:
                yield HEARTBEAT
                continue
            events = projection.apply(entry)
            if events:
                yield b"".join(_frame(entry.seq, event) for event in events)
            ended = any(event["type"] in TERMINAL for event in events)
            if projection.run is None and await done(entry.seq, ended):
                return
    except StorageUnavailable:
        # Ended without a terminal event: the client sees a cut run, and connects again
        # from its last id.
        return
    finally:
        await entries.aclose()  # type: ignore[attr-defined]


async def _paced(
    services: Services, entries: AsyncIterator[LogEntry]
) -> AsyncIterator[LogEntry | None]:
    """The entries, with None whenever a heartbeat is due. (The token's `exp` ends the
    response, as every feed's: gateway/transport/feed_response.py.)"""
    heartbeat_s = services.settings.heartbeat_s
    upcoming: asyncio.Future[LogEntry] | None = None
    try:
        while True:
            if upcoming is None:
                upcoming = asyncio.ensure_future(anext(entries))
            # Waited on without cancelling it: cancelling would close the log's iterator.
            finished, _ = await asyncio.wait({upcoming}, timeout=heartbeat_s)
            if not finished:
                yield None
                continue
            try:
                entry = upcoming.result()
            except StopAsyncIteration:
                return
            upcoming = None
            yield entry
    finally:
        if upcoming is not None:
            upcoming.cancel()
            with contextlib.suppress(BaseException):
                await upcoming
