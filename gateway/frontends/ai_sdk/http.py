"""The AI SDK's HTTP chat transport (`DefaultChatTransport`) on the gateway (docs/protocol.md §11).

- `POST /v1/ai-sdk/chat`: a useChat request; answered with the UI message stream (SSE `data:`
  chunks, `x-vercel-ai-ui-message-stream: v1`, closing `data: [DONE]`);
- `GET /v1/ai-sdk/chat/{chat_id}/stream`: `resumeStream()`; 200 with the active response
  replayed from its start, then live; 204 when nothing is active;
- `POST /v1/ai-sdk/chat/{chat_id}/stop`: `stop()`'s server half, which cancels the run (aborting
  the fetch alone never does);
- `GET /v1/ai-sdk/chat/{chat_id}/messages`: the chat's past as `UIMessage`s.

Refusals are the gateway's coded JSON errors, answered before anything streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.frontends import conversation
from gateway.frontends.ai_sdk import responses
from gateway.frontends.ai_sdk.chat_requests import chat_request
from gateway.frontends.ai_sdk.ui_chunks import RunChunks
from gateway.frontends.ai_sdk.ui_messages import run_messages
from gateway.frontends.answered_again import AnsweredAgain
from gateway.frontends.thread_log import LogEntry, read_span
from gateway.protocol.close_codes import CloseCode
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.run_lifecycle.manager import RunRecord
from gateway.transport.feed_response import END_MESSAGES, FeedResponse
from gateway.transport.http_api import JSONBody, authenticate, endpoint, path_id
from gateway.transport.json_body import read_json_body

STREAM_HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}
KEEP_ALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"


async def _sse(
    services: Services, principal: Principal, response: responses.ChatResponse
) -> AsyncIterator[bytes]:
    async for batch in responses.paced(services, principal, response.chunks):
        if batch is None:
            yield KEEP_ALIVE
            continue
        yield b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in batch)
    yield DONE


def _last_word(code: CloseCode) -> bytes:
    """An `error` chunk, the only way the AI SDK lets a stream say it was cut (a stream that
    just stops looks complete): the client resumes it (`resumeStream()`)."""
    chunk = {"type": "error", "errorText": END_MESSAGES[code]}
    return b"data: " + orjson.dumps(chunk) + b"\n\n" + DONE


def _streamed(
    services: Services, principal: Principal, response: responses.ChatResponse
) -> Response:
    return FeedResponse(
        _sse(services, principal, response),
        response.slot,
        services=services,
        principal=principal,
        last_word=_last_word,
        headers=STREAM_HEADERS,
    )


@endpoint
async def chat(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    body = await read_json_body(request, max_bytes=services.settings.frontend_body_bytes)
    response = await responses.respond(services, principal, chat_request(body))
    return _streamed(services, principal, response)


@endpoint
async def resume_stream(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    chat_id = conversation.conversation_id(request.path_params["chat_id"], "chat id")
    response = await responses.resume(services, principal, chat_id)
    if response is None:
        return Response(status_code=204)
    return _streamed(services, principal, response)


@endpoint
async def stop(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    chat_id = conversation.conversation_id(request.path_params["chat_id"], "chat id")
    stopped = None
    if await conversation.existing_thread(services, principal, chat_id) is not None:
        stopped = await conversation.stop(services, principal, chat_id)
    return JSONBody({"stopped": stopped is not None, "run_id": stopped})


@endpoint
async def messages(request: Request, services: Services) -> Response:
    principal = await authenticate(request, services)
    chat_id = path_id(request, "chat_id")
    thread = await conversation.existing_thread(services, principal, chat_id)
    if thread is None:
        return JSONBody({"messages": []})
    fresh = await services.runs.threads.get(thread.thread_id) or thread
    entries = await read_span(services, principal, thread.thread_id, 0, fresh.head_seq)
    by_run: dict[str, list[LogEntry]] = {}
    # Answers a regenerate or an edit replaced: the chat shows the branch chosen last.
    superseded: set[str] = set()
    # A retry's run -> the failed run whose input it answers again (shown once, the failed
    # run's).
    retried: dict[str, str] = {}

    def may_approve(run: RunRecord, tool: str) -> bool:
        return services.runs.decisions.may_approve(principal, thread, run, tool)

    for entry in entries:
        if entry.run_id is None:
            continue
        by_run.setdefault(entry.run_id, []).append(entry)
        if entry.type == "run.started":
            again = AnsweredAgain.of(entry.data)
            if again.supersedes is not None:
                superseded.add(again.supersedes)
            if again.retries is not None:
                retried[entry.run_id] = again.retries
    # A superseded retry takes the runs it retried with it: they answered the same input.
    for newest in list(superseded):
        run_id = newest
        while run_id in retried:
            run_id = retried[run_id]
            superseded.add(run_id)
    out: list[dict[str, Any]] = []
    for run in await services.runs.runs_of_thread(thread.thread_id):
        if run.run_id in superseded:
            continue
        projection = RunChunks(thread.thread_id, run.run_id, partial(may_approve, run))
        shown_input = None if run.run_id in retried else run.input
        out.extend(run_messages(projection, by_run.get(run.run_id, []), shown_input))
    return JSONBody({"messages": out})


def routes() -> list[Route]:
    return [
        Route("/v1/ai-sdk/chat", chat, methods=["POST"]),
        Route("/v1/ai-sdk/chat/{chat_id}/stream", resume_stream, methods=["GET"]),
        Route("/v1/ai-sdk/chat/{chat_id}/stop", stop, methods=["POST"]),
        Route("/v1/ai-sdk/chat/{chat_id}/messages", messages, methods=["GET"]),
    ]
