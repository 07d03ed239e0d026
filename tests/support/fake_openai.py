"""A tiny stand-in for the OpenAI Responses API, to drive the gateway's real OpenAI provider path.

`POST /v1/responses` with `"stream": true` answers with Server-Sent Events in the wire order and
shape the `openai` SDK parses (`response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`...,
`response.output_text.done`, `response.content_part.done`, `response.output_item.done`, function
calls with `response.function_call_arguments.delta/done`, and `response.completed` with the whole
response including usage): the sequence the offline demo model streams, from the same code
(gateway/agents/demo/response_events.py), built with the `openai.types.responses` models, so a
shape the SDK would reject fails here first. Without `stream` it answers the finished response
as JSON.

What it answers follows the offline demo model's rules for two cases (docs/protocol.md §9), applied
to the newest user message of the request's `input`:

- tool outputs (`function_call_output` items) after that message -> a final text quoting each one;
- it mentions "refund" -> a short sentence and one `issue_refund` call with `order_id` = the first
  integer and `amount` = the second number (10 if none);
- anything else -> a reply that quotes the input.

`POST /v1/chat/completions` answers the same plans in Chat Completions' shape (streamed chunks
with content deltas and tool-call deltas, a usage chunk, `[DONE]`; or the finished completion),
reading `tool` messages as tool outputs.

Every request, on any path, is recorded (method, path, headers, JSON body) for assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)
from openai.types.responses.response_reasoning_item import ResponseReasoningItem, Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.responses import Response as HTTPResponse
from starlette.routing import Route

from gateway.agents.demo.response_events import response_events, split_deltas

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_NUMBER_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Plan:
    text: str
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # A reasoning summary streamed before the answer, in paragraphs (summary parts).
    reasoning: list[str] = field(default_factory=list)


# -- reading the request --------------------------------------------------------------------


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
        )
    return ""


def plan_for(input_: Any) -> Plan:
    """The demo rules for `refund` and tool outputs, on the newest user message."""
    items = [{"role": "user", "content": input_}] if isinstance(input_, str) else list(input_)
    user_index = max(
        (
            i
            for i, item in enumerate(items)
            if isinstance(item, dict) and item.get("role") == "user"
        ),
        default=-1,
    )
    user_text = _content_text(items[user_index].get("content")) if user_index >= 0 else ""
    outputs = [
        item.get("output")
        for item in items[user_index + 1 :]
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    if outputs:
        lines = "\n".join(
            f"- {o if isinstance(o, str) else json.dumps(o, ensure_ascii=False)}" for o in outputs
        )
        return Plan(f"Here is what happened:\n{lines}\nIs there anything else I can help with?")
    if "refund" in user_text.lower():
        numbers = _NUMBER_RE.findall(user_text)
        integers = [n for n in numbers if "." not in n]
        order_id = int(integers[0]) if integers else 1
        rest = list(numbers)
        if integers:
            rest.remove(integers[0])
        amount: int | float = (float(rest[0]) if "." in rest[0] else int(rest[0])) if rest else 10
        sentence = f"I will refund {amount} USD for order {order_id}; this needs your approval."
        return Plan(sentence, [("issue_refund", {"order_id": order_id, "amount": amount})])
    if "think" in user_text.lower():
        return Plan(
            f'You said: "{user_text}"',
            reasoning=["The user wants me to think it over.", "Quoting them back is enough."],
        )
    return Plan(f'You said: "{user_text}"')


# -- building the response ------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def build_response(model: str, plan: Plan, input_: Any) -> Response:
    output: list[Any] = []
    if plan.reasoning:
        output.append(
            ResponseReasoningItem(
                id=_new_id("rs"),
                type="reasoning",
                summary=[Summary(type="summary_text", text=text) for text in plan.reasoning],
            )
        )
    if plan.text:
        output.append(
            ResponseOutputMessage(
                id=_new_id("msg"),
                type="message",
                role="assistant",
                status="completed",
                content=[
                    ResponseOutputText(
                        type="output_text", text=plan.text, annotations=[], logprobs=[]
                    )
                ],
            )
        )
    for name, args in plan.calls:
        output.append(
            ResponseFunctionToolCall(
                id=_new_id("fc"),
                type="function_call",
                call_id=_new_id("call"),
                name=name,
                arguments=json.dumps(args),
                status="completed",
            )
        )
    in_tokens = len(json.dumps(input_).split())
    out_tokens = len(plan.text.split()) + sum(len(json.dumps(a).split()) for _, a in plan.calls)
    return Response(
        id=_new_id("resp"),
        object="response",
        created_at=time.time(),
        model=model,
        output=output,
        status="completed",
        parallel_tool_calls=True,
        tool_choice="auto",
        tools=[],
        top_p=1.0,
        temperature=1.0,
        usage=ResponseUsage(
            input_tokens=in_tokens,
            output_tokens=out_tokens,
            total_tokens=in_tokens + out_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
            output_tokens_details=OutputTokensDetails(
                reasoning_tokens=sum(len(text.split()) for text in plan.reasoning)
            ),
        ),
    )


def _json(event: Any) -> str:
    if isinstance(event, dict):
        return json.dumps(event)
    return event.model_dump_json(by_alias=True, exclude_none=True)


# -- the server -----------------------------------------------------------------------------


class FakeOpenAI:
    def __init__(self, *, delta_delay_s: float = 0.005) -> None:
        self.delta_delay_s = delta_delay_s
        self.requests: list[RecordedRequest] = []
        self.app = Starlette(
            routes=[
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/{path:path}", self._other, methods=ALL_METHODS),
            ]
        )

    async def _record(self, request: Request) -> RecordedRequest:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        recorded = RecordedRequest(
            request.method,
            request.url.path,
            {k.lower(): v for k, v in request.headers.items()},
            body,
        )
        self.requests.append(recorded)
        return recorded

    @property
    def response_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST" and r.path == "/v1/responses"]

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST" and r.path == "/v1/chat/completions"]

    async def _other(self, request: Request) -> HTTPResponse:
        await self._record(request)
        return JSONResponse(
            {"error": {"message": "not found", "type": "invalid_request_error"}}, status_code=404
        )

    async def _responses(self, request: Request) -> HTTPResponse:
        recorded = await self._record(request)
        body = recorded.body if isinstance(recorded.body, dict) else {}
        response = build_response(
            str(body.get("model")), plan_for(body.get("input", "")), body.get("input")
        )
        if not body.get("stream"):
            return HTTPResponse(_json(response), media_type="application/json")

        async def sse() -> AsyncIterator[str]:
            for event in response_events(response, argument_deltas=2):
                kind = event["type"] if isinstance(event, dict) else event.type
                if kind == "response.output_text.delta" and self.delta_delay_s:
                    await asyncio.sleep(self.delta_delay_s)
                yield f"event: {kind}\ndata: {_json(event)}\n\n"

        return StreamingResponse(
            sse(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-request-id": _new_id("req")},
        )

    async def _chat_completions(self, request: Request) -> HTTPResponse:
        recorded = await self._record(request)
        body = recorded.body if isinstance(recorded.body, dict) else {}
        messages = body.get("messages") or []
        plan = plan_for(chat_items(messages))
        model = str(body.get("model"))
        if not body.get("stream"):
            return JSONResponse(chat_completion(model, plan, messages))

        async def sse() -> AsyncIterator[str]:
            for chunk in chat_chunks(model, plan, messages):
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    if self.delta_delay_s:
                        await asyncio.sleep(self.delta_delay_s)
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")


def chat_items(messages: list[Any]) -> list[dict[str, Any]]:
    """Chat messages as the Responses items `plan_for` reads: tool messages are outputs."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool":
            items.append({"type": "function_call_output", "output": message.get("content")})
        else:
            items.append({"role": message.get("role"), "content": message.get("content")})
    return items


def _chat_usage(plan: Plan, messages: list[Any]) -> dict[str, int]:
    prompt = len(json.dumps(messages).split())
    completion = len(plan.text.split()) + sum(len(json.dumps(a).split()) for _, a in plan.calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _tool_calls(plan: Plan) -> list[dict[str, Any]]:
    return [
        {
            "id": _new_id("call"),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        for name, args in plan.calls
    ]


def chat_completion(model: str, plan: Plan, messages: list[Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": plan.text or None}
    if plan.calls:
        message["tool_calls"] = _tool_calls(plan)
    return {
        "id": _new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if plan.calls else "stop",
            }
        ],
        "usage": _chat_usage(plan, messages),
    }


def chat_chunks(model: str, plan: Plan, messages: list[Any]) -> Iterator[dict[str, Any]]:
    """The streamed chunks of a completion: role, content deltas, each tool call in two
    argument deltas, the finish reason, then usage (`stream_options.include_usage`)."""
    base = {
        "id": _new_id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    for piece in split_deltas(plan.text):
        yield chunk({"content": piece})
    for index, call in enumerate(_tool_calls(plan)):
        arguments = call["function"]["arguments"]
        middle = len(arguments) // 2
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["function"]["name"],
                            "arguments": arguments[:middle],
                        },
                    }
                ]
            }
        )
        yield chunk(
            {"tool_calls": [{"index": index, "function": {"arguments": arguments[middle:]}}]}
        )
    yield chunk({}, "tool_calls" if plan.calls else "stop")
    yield {**base, "choices": [], "usage": _chat_usage(plan, messages)}


@contextlib.asynccontextmanager
async def running_fake_openai(**kwargs: Any) -> AsyncIterator[tuple[FakeOpenAI, int]]:
    """(fake, port) with the fake served by uvicorn on 127.0.0.1, on a free port."""
    fake = FakeOpenAI(**kwargs)
    server = uvicorn.Server(
        uvicorn.Config(fake.app, host="127.0.0.1", port=0, lifespan="off", log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 20
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("fake OpenAI server exited during start-up")
        if time.monotonic() > deadline:
            raise TimeoutError("fake OpenAI server did not start")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield fake, port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
