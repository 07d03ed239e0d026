"""The responses a useChat client gets, whatever carries them (HTTP or the WebSocket transport).

A response is a stretch of one run's chunks (gateway/frontends/ai_sdk/ui_chunks.py):

- a new message starts a run and streams it from its `run.started`;
- answers to approvals are decided (checked against the server's pending approvals), and the
  run's chunks stream from just after the pause they answer, continuing the same assistant
  message;
- a resume replays the active run's whole message from its start (the client rebuilds the
  message from the replay), then follows it live; a run waiting on its reader's own decisions
  has nothing active.

Whatever carries it, a response holds one of its reader's open-connection slots
(`GATEWAY_MAX_CONNECTIONS_PER_USER`, as an SSE feed does) until its transport releases it; over
the limit it is refused with `rate_limited` before anything happens.

Each ends where the run finishes, or pauses on a call its reader may decide (answers to some
of a pause's calls are followed by the rest of the run, however long a reviewer takes over the
others). Everything before the
first chunk (the checks, the decisions, the start of the run) raises `GatewayError`, so a refusal
changes nothing and is answered before anything streams; a failure afterwards is an `error`
chunk, the only way the AI SDK lets a stream say so (a cut stream would look complete).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.abuse.limits import ConnectionSlot
from gateway.frontends import conversation
from gateway.frontends.ai_sdk.chat_requests import AnsweredInput, ChatRequest
from gateway.frontends.ai_sdk.ui_chunks import Boundary, Chunk, RunChunks
from gateway.frontends.answered_again import AnsweredAgain
from gateway.frontends.thread_log import follow, read_span
from gateway.protocol.error_codes import conflict, not_found
from gateway.protocol.frames import EventType
from gateway.protocol.identity import Principal
from gateway.resources import Services
from gateway.run_lifecycle.manager import RunRecord, ThreadRecord
from gateway.run_lifecycle.started import Started
from gateway.storage.health import StorageUnavailable

# Chunks written together at most, and held between the response and its transport.
BATCH = 64


@dataclass(frozen=True)
class AfterPause:
    """Where the continuation of answered approvals starts: just after the run's last pause as
    of `head`, the thread's head when the answers came. Once decided, the run may resume and
    pause again before the log is read; that later pause belongs in the response."""

    head: int


@dataclass
class ChatResponse:
    chunks: AsyncIterator[Chunk]
    # Held while the response streams; its transport releases it (idempotent) at the end.
    slot: ConnectionSlot


def _open_slot(services: Services, principal: Principal) -> ConnectionSlot:
    return services.limits.open_connection(principal.tenant, principal.user)


async def respond(services: Services, principal: Principal, request: ChatRequest) -> ChatResponse:
    """The response to a `send`: a new message's run, or the continuation its answers to
    approvals allow. Raises GatewayError, having changed nothing, when it cannot be served."""
    slot = _open_slot(services, principal)
    try:
        chunks = await _respond(services, principal, request)
    except BaseException:
        slot.release()
        raise
    return ChatResponse(chunks, slot)


async def _respond(
    services: Services, principal: Principal, request: ChatRequest
) -> AsyncIterator[Chunk]:
    if request.decisions:
        return await _answer_approvals(services, principal, request)
    if request.regenerate:
        supersedes = request.supersedes
        if request.answered_input is not None:
            supersedes = await _input_run(
                services, principal, request.chat_id, request.answered_input
            )
        started = await conversation.regenerate(
            services, principal, request.chat_id, request.text, supersedes
        )
        return await _started_response(services, principal, started)
    assert request.text is not None
    thread = await conversation.existing_thread(services, principal, request.chat_id)
    if thread is not None and await services.runs.active_run(thread.thread_id) is not None:
        raise conflict("a response is already active for this chat; stop it or resume it")
    started = await conversation.start_turn(services, principal, request.chat_id, request.text)
    return await _started_response(services, principal, started)


async def _input_run(
    services: Services, principal: Principal, chat_id: str, answered: AnsweredInput
) -> str:
    """The run whose input `answered` is; `conflict` unless it is the chat's last input (the
    gateway answers only that one anew: an earlier turn's edit would need a branch of its
    own, and answering it as the last would replace the wrong turn)."""
    thread = await conversation.existing_thread(services, principal, chat_id)
    if thread is None:
        raise not_found("thread not found")
    runs = await services.runs.runs_of_thread(thread.thread_id)
    if not runs:
        raise conflict("the thread has no answer to regenerate")

    async def answers_again(run_id: str) -> AnsweredAgain:
        return await _answered_again(services, principal, thread.thread_id, run_id)

    if answered.run_id is not None:
        # The gateway's own id. A failed run's input stays its name after a retry (the
        # retry answers the same input, and the history shows it once): the retry's run is
        # answered anew. Any other run but the last is refused by `run.regenerate`.
        run_id = runs[-1].run_id
        while run_id != answered.run_id:
            retries = (await answers_again(run_id)).retries
            if retries is None:
                return answered.run_id
            run_id = retries
        return runs[-1].run_id
    # The last input's runs: the last one and those it answers again, one after another (a
    # regenerate supersedes the run just before it, a retry answers a failed run's input
    # again). The run before them answered the previous input.
    first = len(runs) - 1
    while first > 0:
        again = await answers_again(runs[first].run_id)
        if (again.supersedes or again.retries) != runs[first - 1].run_id:
            break
        first -= 1
    previous = runs[first - 1].run_id if first > 0 else None
    if answered.follows != previous:
        raise conflict("only the chat's last input can be edited or answered again")
    return runs[-1].run_id


async def _answered_again(
    services: Services, principal: Principal, thread_id: str, run_id: str
) -> AnsweredAgain:
    """What run `run_id`'s `run.started` says of the runs before it."""
    seq = await services.runs.first_seq(thread_id, run_id)
    if seq is None:
        return AnsweredAgain()
    started = await read_span(services, principal, thread_id, seq - 1, seq)
    return AnsweredAgain.of(started[0].data) if started else AnsweredAgain()


async def _started_response(
    services: Services, principal: Principal, started: Started
) -> AsyncIterator[Chunk]:
    """A new run's message, from its `run.started`."""
    run = await services.runs.active_run(started.thread_id)
    response = await _response(
        services, principal, started.thread, started.run_id, run, emit_after=started.first_seq - 1
    )
    assert response is not None  # only a resume finds nothing to send
    return response


async def resume(services: Services, principal: Principal, chat_id: str) -> ChatResponse | None:
    """The chat's active response, replayed from its start; None when nothing is active: no
    run, or one that ended (finished, or paused on this reader's own decisions) longer than
    `GATEWAY_AI_SDK_REPLAY_WINDOW_S` ago. Within the window an ended response is replayed to
    its end, so a client that dropped just before it loses nothing."""
    thread = await conversation.existing_thread(services, principal, chat_id)
    if thread is None:
        return None
    run = await services.runs.active_run(thread.thread_id)
    if run is None:
        latest = await services.runs.runs_of_thread(thread.thread_id, limit=1)
        if not latest or services.settings.ai_sdk_replay_window_s <= 0:
            return None
        run = latest[-1]
    chunks = await _response(services, principal, thread, run.run_id, run, emit_after=None)
    return None if chunks is None else ChatResponse(chunks, _open_slot(services, principal))


async def _answer_approvals(
    services: Services, principal: Principal, request: ChatRequest
) -> AsyncIterator[Chunk]:
    thread = await conversation.existing_thread(services, principal, request.chat_id)
    if thread is None:
        raise not_found("chat not found")
    run = await services.runs.active_run(thread.thread_id)
    if run is None:
        raise conflict("the chat has no run waiting for these approvals")
    if request.message_id is not None and request.message_id != run.run_id:
        raise conflict("the message answered is not the chat's active response")
    # `thread` was read before deciding: its head bounds the pause these answers answer.
    answered = AfterPause(thread.head_seq)
    await conversation.decide_all(
        services, principal, request.decisions, thread_id=thread.thread_id
    )
    response = await _response(services, principal, thread, run.run_id, run, emit_after=answered)
    assert response is not None
    return response


async def _response(
    services: Services,
    principal: Principal,
    thread: ThreadRecord,
    run_id: str,
    run: RunRecord | None,
    *,
    emit_after: int | AfterPause | None,
) -> AsyncIterator[Chunk] | None:
    """`emit_after`: the seq after which chunks are sent (the run's start for a new message),
    an `AfterPause` for answered approvals, None for a resume's full replay."""
    thread_id = thread.thread_id
    first = await services.runs.first_seq(thread_id, run_id)
    if first is None:
        raise not_found("run not found")
    fresh = await services.runs.threads.get(thread_id)
    head = fresh.head_seq if fresh is not None else thread.head_seq

    def may_decide(tool_name: str) -> bool:
        return run is not None and services.runs.decisions.may_approve(
            principal, thread, run, tool_name
        )

    projection = RunChunks(thread_id, run_id, may_decide)
    span = [
        entry
        for entry in await read_span(services, principal, thread_id, first - 1, head)
        if entry.run_id == run_id
    ]
    if isinstance(emit_after, AfterPause):
        pauses = [
            e.seq for e in span if e.type == EventType.RUN_PAUSED and e.seq <= emit_after.head
        ]
        after = pauses[-1] if pauses else first - 1
    else:
        after = first - 1 if emit_after is None else emit_after
    chunks: list[Chunk] = [projection.start(head)]
    ended = False
    for index, entry in enumerate(span):
        step = projection.feed(entry)
        if entry.seq <= after:
            continue
        chunks.extend(step.chunks)
        last = index == len(span) - 1
        if step.boundary is Boundary.FINISHED or (
            step.boundary is Boundary.CALLER_DECIDES and last
        ):
            if emit_after is None and _ended_long_ago(services, entry.ts):
                # The message ended before the replay window: nothing is active.
                return None
            chunks.extend(step.closing)
            ended = True
            break
    return _stream(services, principal, projection, chunks, None if ended else head)


def _ended_long_ago(services: Services, ts: str) -> bool:
    ended = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    age_s = (datetime.now(UTC) - ended).total_seconds()
    return age_s > services.settings.ai_sdk_replay_window_s


async def _stream(
    services: Services,
    principal: Principal,
    projection: RunChunks,
    replayed: list[Chunk],
    live_after: int | None,
) -> AsyncIterator[Chunk]:
    """The replayed chunks, then (unless the response already ended) the run's live ones until
    its next boundary."""
    for chunk in replayed:
        yield chunk
    if live_after is None:
        return
    try:
        async for entry in follow(services, principal, projection.thread_id, live_after):
            if entry.run_id != projection.run_id:
                continue
            step = projection.feed(entry)
            for chunk in step.chunks:
                yield chunk
            if step.boundary is not None:
                for chunk in step.closing:
                    yield chunk
                return
    except StorageUnavailable:
        yield {
            "type": "error",
            "errorText": "storage unavailable: the stream stopped; resume it to continue",
        }


async def paced(
    services: Services, principal: Principal, chunks: AsyncIterator[Chunk]
) -> AsyncIterator[list[Chunk] | None]:
    """The chunks in batches of those ready together (a replay, a commit's events), so a
    transport writes each batch at once; None whenever `GATEWAY_HEARTBEAT_S` passes without
    one (a keep-alive for the transport to send). Ends with an `error` chunk at the token's
    `exp` (plus leeway): the client resumes with a fresh token."""
    heartbeat_s = services.settings.heartbeat_s
    deadline = None
    if principal.expires_at is not None:
        deadline = principal.expires_at + services.verifier.leeway_s
    queue: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue(maxsize=BATCH)

    async def produce() -> None:
        try:
            async for chunk in chunks:
                await queue.put(chunk)
        except Exception as exc:
            await queue.put(exc)
            return
        await queue.put(None)

    producer = asyncio.create_task(produce(), name="ai-sdk-response")
    try:
        while True:
            left = heartbeat_s if deadline is None else min(heartbeat_s, deadline - time.time())
            if left <= 0:
                yield [
                    {
                        "type": "error",
                        "errorText": "token has expired: resume the stream with a fresh token",
                    }
                ]
                return
            try:
                item = await asyncio.wait_for(queue.get(), left)
            except TimeoutError:
                yield None
                continue
            batch: list[Chunk] = []
            while True:
                if item is None:
                    if batch:
                        yield batch
                    return
                if isinstance(item, BaseException):
                    if batch:
                        yield batch
                    raise item
                batch.append(item)
                if queue.empty() or len(batch) >= BATCH:
                    break
                item = queue.get_nowait()
            yield batch
    finally:
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await producer
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]
