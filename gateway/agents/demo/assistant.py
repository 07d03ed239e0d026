"""The offline demo agent `assistant` (docs/protocol.md §9).

`OfflineDemoModel` is a deterministic stand-in for a Responses-API model: it reads the newest
user input, decides on text and tool calls by simple keyword rules, and streams exactly the event
shapes a real OpenAI Responses stream produces. The gateway therefore works end to end (deltas,
multi-turn tool use, approvals, checkpoints) with no network and no API key.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from agents import Agent, function_tool
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import (
    ModelResponse,
    TResponseInputItem,
    TResponseOutputItem,
    TResponseStreamEvent,
)
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.testing import assistant_message, function_call
from agents.tool import Tool
from agents.tool_context import ToolContext
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam
from openai.types.responses.response_reasoning_item import ResponseReasoningItem, Summary
from openai.types.responses.response_reasoning_summary_text_delta_event import (
    ResponseReasoningSummaryTextDeltaEvent,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from gateway.agents.approval_rules import ApprovalRule, Verdict
from gateway.agents.demo.response_events import response_events
from gateway.agents.exactly_once import Policy, run_once
from gateway.agents.registry import AgentGraph
from gateway.agents.run_caller import RunCaller
from gateway.auth.access import DecidedBy
from gateway.protocol.error_codes import CodedError

DEMO_AGENT_NAME = "assistant"
DEMO_AGENT_VERSION = "1"
OFFLINE_MODEL_NAME = "offline-demo"
DEFAULT_EMAIL = "customer@example.com"
MAX_STATUS_LOOKUPS = 5
# How many `flaky` conversations a model remembers having failed once (rule `flaky`).
MAX_REMEMBERED_OUTAGES = 1024
YIELD_EVERY_DELTAS = 50

INSTRUCTIONS = (
    "You are a helpful customer-support assistant. Look up order status with "
    "get_order_status, issue refunds with issue_refund and send e-mails with send_email. "
    "Refunds and e-mails need a human's approval before they run."
)


# --------------------------------------------------------------------------------------------
# Tools. Pure and deterministic: the same arguments always give the same text, and nothing
# outside this process changes (a side-effect ledger wraps them elsewhere).
# --------------------------------------------------------------------------------------------

_CARRIERS = ("UPS", "DHL", "FedEx", "USPS", "PostNL")
_STATES = ("processing", "packed", "shipped", "out for delivery", "delivered")


def _digest(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def order_status_text(order_id: int) -> str:
    state = _STATES[order_id % len(_STATES)]
    carrier = _CARRIERS[(order_id // len(_STATES)) % len(_CARRIERS)]
    day = 1 + order_id % 28
    month = 1 + order_id % 12
    return f"Order {order_id}: {state} via {carrier} (updated 2025-{month:02d}-{day:02d})"


def refund_text(order_id: int, amount: float) -> str:
    ref = _digest("refund", order_id, f"{amount:.2f}")[:8].upper()
    return f"Refund of {amount:.2f} USD issued for order {order_id} (ref RF-{ref})"


def email_text(to: str, subject: str) -> str:
    return f"Email sent to {to}: {subject}"


def get_order_status(order_id: int) -> str:
    """Look up the current status of an order.

    Args:
        order_id: The order number.
    """
    return order_status_text(order_id)


async def issue_refund(ctx: ToolContext[Any], order_id: int, amount: float) -> str:
    """Refund money to the customer for an order. Needs approval.

    Args:
        order_id: The order number.
        amount: The amount to refund, in USD.
    """
    # Through the ledger: a refund happens once per approved call, even across crashes. A
    # refund whose outcome is unknown after a crash is reported, never silently repeated.
    return await run_once(ctx, lambda key: refund_text(order_id, amount), policy=Policy.RECONCILE)


async def send_email(ctx: ToolContext[Any], to: str, subject: str, body: str) -> str:
    """Send an e-mail to a customer. Needs approval.

    Args:
        to: The recipient's e-mail address.
        subject: The subject line.
        body: The message body.
    """
    # Mail providers deduplicate on the idempotency key, so re-sending after a crash is safe.
    return await run_once(ctx, lambda key: email_text(to, subject), policy=Policy.RERUN)


def demo_tools() -> list[Tool]:
    """Fresh tool objects per agent build, so no two graphs share live tool state."""
    return [
        function_tool(get_order_status),
        function_tool(issue_refund, needs_approval=True),
        function_tool(send_email, needs_approval=True),
    ]


# --------------------------------------------------------------------------------------------
# Reading the model input. Items are TypedDicts on a live run but may be pydantic objects when
# a caller passes SDK items straight through, so every access goes through `_field`.
# --------------------------------------------------------------------------------------------


def _field(item: Any, key: str) -> Any:
    if isinstance(item, dict):
        return item.get(key)
    return getattr(item, key, None)


def _content_text(content: Any) -> str:
    """Text of a message's content: a plain string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = [
        _field(part, "text")
        for part in content
        if _field(part, "type") in ("input_text", "output_text", "text")
    ]
    return "\n".join(t for t in texts if isinstance(t, str))


@dataclass(frozen=True)
class _Turn:
    """What the model needs to know: the newest user text and the tool traffic after it."""

    user_text: str
    call_names: dict[str, str]  # call_id -> tool name, for calls after the newest user message
    outputs: list[tuple[str, str]]  # (call_id, output text), in order


def _read_turn(input: str | list[TResponseInputItem]) -> _Turn:
    if isinstance(input, str):
        return _Turn(user_text=input, call_names={}, outputs=[])
    items = list(input)
    last_user = -1
    for index, item in enumerate(items):
        if _field(item, "role") == "user":
            last_user = index
    user_text = _content_text(_field(items[last_user], "content")) if last_user >= 0 else ""
    call_names: dict[str, str] = {}
    outputs: list[tuple[str, str]] = []
    for item in items[last_user + 1 :]:
        kind = _field(item, "type")
        if kind == "function_call":
            call_names[str(_field(item, "call_id"))] = str(_field(item, "name"))
        elif kind == "function_call_output":
            output = _field(item, "output")
            text = output if isinstance(output, str) else _content_text(output)
            outputs.append((str(_field(item, "call_id")), text))
    return _Turn(user_text=user_text, call_names=call_names, outputs=outputs)


_EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# Digits not glued to a word ("order42" or "v2" are not numbers a user means).
_NUMBER_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")


def _numbers(text: str) -> list[str]:
    # Addresses often carry digits ("bob42@x.com"); they are never order numbers or amounts.
    return _NUMBER_RE.findall(_EMAIL_RE.sub(" ", text))


def _integers(text: str) -> list[int]:
    return [int(n) for n in _numbers(text) if "." not in n]


def _refund_args(text: str) -> dict[str, Any]:
    numbers = _numbers(text)
    order_index = next((i for i, n in enumerate(numbers) if "." not in n), None)
    order_id = int(numbers[order_index]) if order_index is not None else 1
    rest = [n for i, n in enumerate(numbers) if i != order_index]
    amount = float(rest[0]) if rest else 10.0
    return {"order_id": order_id, "amount": amount}


def _email_args(text: str) -> dict[str, Any]:
    match = _EMAIL_RE.search(text)
    to = match.group(0) if match else DEFAULT_EMAIL
    integers = _integers(text)
    subject = f"About your order {integers[0]}" if integers else "About your request"
    body = f'Hello,\n\nFollowing up on your message: "{text.strip()}"\n\nBest regards,\nSupport'
    return {"to": to, "subject": subject, "body": body}


# --------------------------------------------------------------------------------------------
# The rules (docs/protocol.md §9).
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    text: str
    calls: list[tuple[str, dict[str, Any]]]
    # A reasoning summary streamed before the answer, a paragraph a summary part.
    reasoning: tuple[str, ...] = ()


def _final_answer(outputs: Sequence[tuple[str, str]]) -> str:
    lines = "\n".join(f"- {text}" for _, text in outputs)
    return f"Here is what happened:\n{lines}\nIs there anything else I can help with?"


def _plan(turn: _Turn) -> _Plan:
    text = turn.user_text
    lowered = text.lower()
    wants_refund = "refund" in lowered
    wants_email = "email" in lowered

    if wants_refund or wants_email:
        if turn.outputs:
            return _Plan(_final_answer(turn.outputs), [])
        calls: list[tuple[str, dict[str, Any]]] = []
        steps: list[str] = []
        if wants_refund:
            args = _refund_args(text)
            calls.append(("issue_refund", args))
            steps.append(f"refund {args['amount']:.2f} USD for order {args['order_id']}")
        if wants_email:
            args = _email_args(text)
            calls.append(("send_email", args))
            steps.append(f"send an e-mail to {args['to']}")
        sentence = f"I will {' and '.join(steps)}; this needs your approval."
        return _Plan(sentence, calls)

    if "flaky" in lowered and not turn.outputs:
        # A lookup first, so the outage below comes after a turn that a retry keeps.
        order_id = (_integers(text) or [1])[0]
        sentence = f"Let me check the status of order {order_id}."
        return _Plan(sentence, [("get_order_status", {"order_id": order_id})])

    if "status" in lowered:
        order_ids = (_integers(text) or [1])[:MAX_STATUS_LOOKUPS]
        # One lookup per model response: how many are done decides which one comes next.
        # A call whose name is unknown (history trimmed by the caller) still counts as done.
        done = sum(
            1
            for call_id, _ in turn.outputs
            if turn.call_names.get(call_id, "get_order_status") == "get_order_status"
        )
        if done < len(order_ids):
            order_id = order_ids[done]
            sentence = f"Let me check the status of order {order_id}."
            return _Plan(sentence, [("get_order_status", {"order_id": order_id})])
        return _Plan(_final_answer(turn.outputs), [])

    if turn.outputs:
        return _Plan(_final_answer(turn.outputs), [])
    if "story" in lowered:
        return _Plan(_story(text), [])
    if "think" in lowered:
        summary = (f"The user asks me to think about: {text.strip()}", "Quoting it back will do.")
        return _Plan(f'You said: "{text}"', [], summary)
    return _Plan(f'You said: "{text}"', [])


# Heroes start with a consonant sound so "a {hero}" always reads right.
_HEROES = (
    "lighthouse keeper",
    "retired cartographer",
    "young baker",
    "clockmaker",
    "courier on a red bicycle",
    "librarian",
    "ship's cook",
    "night-shift nurse",
)
_PLACES = (
    "a harbour town",
    "a mountain village",
    "a city of bridges",
    "a desert outpost",
    "an island of windmills",
    "a river port",
    "a forest crossroads",
    "a snowbound station",
)
_OBJECTS = (
    "a brass key",
    "an unsigned letter",
    "a map with one missing street",
    "a jar of blue sand",
    "a pocket watch that ran backwards",
    "a parcel with no sender",
)
_WEATHER = (
    "rain drummed on the roofs",
    "fog rolled in from the water",
    "the wind smelled of pine",
    "snow fell without a sound",
    "the sun hung low and orange",
    "thunder muttered far away",
)
_MIDDLES = (
    "Nobody in town remembered seeing it before, and everybody had an opinion about it.",
    "The old stories said such things only turned up when something needed fixing.",
    "At first it seemed ordinary, but it grew warmer whenever it pointed the right way.",
    "Every evening it appeared in a slightly different place, as if it were impatient.",
    "A neighbour swore it had once belonged to the founder of the town.",
)
_TURNS = (
    "Following the clue meant walking past the market, the quay and the empty mill.",
    "The trail led through narrow streets where the lamps flickered in a strange rhythm.",
    "Each stop on the way offered a new question and, sometimes, a cup of tea.",
    "Old friends helped, strangers warned, and a stray cat insisted on coming along.",
    "The path doubled back twice, which was annoying and, in hindsight, important.",
)
_ENDINGS = (
    "In the end the answer was simple: someone had wanted the town to talk to itself again.",
    "When the last door opened, there was only a note that said thank you for looking.",
    "The mystery closed quietly, and the whole town slept better that night.",
    "What had been lost was returned, and what had been found was shared.",
)


def _story(prompt: str) -> str:
    """A deterministic story of at least 200 words, varied by the prompt."""
    rng = random.Random(_digest("story", prompt.strip().lower()))
    hero, place, thing = rng.choice(_HEROES), rng.choice(_PLACES), rng.choice(_OBJECTS)
    paragraphs = [
        f"Once upon a time, in {place}, there lived a {hero}. One morning, while "
        f"{rng.choice(_WEATHER)}, the {hero} found {thing} on the doorstep."
    ]
    middles = rng.sample(_MIDDLES, len(_MIDDLES))
    turns = rng.sample(_TURNS, len(_TURNS))
    for middle, turn_ in zip(middles, turns, strict=True):
        paragraphs.append(f"{middle} {turn_} Meanwhile {rng.choice(_WEATHER)}.")
    paragraphs.append(
        f"{rng.choice(_ENDINGS)} And the {hero} kept it on the windowsill, "
        f"just in case {place} ever needed another adventure. The end."
    )
    story = "\n\n".join(paragraphs)
    # The pools guarantee the length today; this keeps the promise if they are ever trimmed.
    while len(story.split()) < 200:
        story += f"\n\n{rng.choice(_MIDDLES)} {rng.choice(_TURNS)}"
    return story


# --------------------------------------------------------------------------------------------
# The model.
# --------------------------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def _output_items(plan: _Plan) -> list[TResponseOutputItem]:
    items: list[TResponseOutputItem] = []
    if plan.reasoning:
        summary = [Summary(type="summary_text", text=text) for text in plan.reasoning]
        items.append(ResponseReasoningItem(id=_new_id("rs"), type="reasoning", summary=summary))
    if plan.text:
        items.append(assistant_message(plan.text, item_id=_new_id("msg")))
    for name, args in plan.calls:
        call = function_call(name, args, call_id=_new_id("call"), item_id=_new_id("fc"))
        items.append(
            cast(ResponseFunctionToolCall, call).model_copy(update={"status": "completed"})
        )
    return items


def _count_tokens(
    input: str | list[TResponseInputItem], items: list[TResponseOutputItem]
) -> tuple[int, int]:
    """Rough word counts so usage looks plausible; nothing depends on their exact values."""
    in_tokens = len(json.dumps(input, default=str).split())
    out_tokens = 0
    for item in items:
        if isinstance(item, ResponseOutputMessage):
            out_tokens += sum(len(getattr(c, "text", "").split()) for c in item.content)
        elif isinstance(item, ResponseFunctionToolCall):
            out_tokens += len(item.arguments.split()) + 1
        elif isinstance(item, ResponseReasoningItem):
            out_tokens += sum(len(part.text.split()) for part in item.summary)
    return in_tokens, out_tokens


def _reasoning_tokens(items: list[TResponseOutputItem]) -> int:
    return sum(
        len(part.text.split())
        for item in items
        if isinstance(item, ResponseReasoningItem)
        for part in item.summary
    )


class SimulatedOutage(CodedError, RuntimeError):
    """The offline model's stand-in for a model server that fails a call (rule `flaky`)."""


class OfflineDemoModel(Model):
    """Deterministic offline model following the rules of docs/protocol.md §9."""

    def __init__(self, delay_ms: int = 15) -> None:
        self.delay_ms = max(0, delay_ms)
        # The `flaky` conversations whose answer failed once already in this process: the
        # next attempt (a retry) gets its answer. Bounded, oldest first out.
        self._failed_once: OrderedDict[str, None] = OrderedDict()

    def _simulate_outage(self, turn: _Turn) -> None:
        """Rule `flaky`: the answer after the lookup fails the first time it is asked for."""
        if "flaky" not in turn.user_text.lower() or not turn.outputs:
            return
        key = _digest("flaky", turn.user_text, *(output for _, output in turn.outputs))
        if key in self._failed_once:
            return
        self._failed_once[key] = None
        while len(self._failed_once) > MAX_REMEMBERED_OUTAGES:
            self._failed_once.popitem(last=False)
        raise SimulatedOutage("the model server did not answer (a simulated outage)")

    def _respond(self, input: str | list[TResponseInputItem], tools: list[Tool]) -> Response:
        turn = _read_turn(input)
        self._simulate_outage(turn)
        plan = _plan(turn)
        available = {tool.name for tool in tools}
        if any(name not in available for name, _ in plan.calls):
            # Served to an agent without the demo tools (any graph can run on the offline
            # provider): calling an unknown tool would fail the run, so just answer in text.
            plan = _Plan(f'You said: "{turn.user_text}"', [])
        items = _output_items(plan)
        in_tokens, out_tokens = _count_tokens(input, items)
        return Response(
            id=_new_id("resp"),
            created_at=time.time(),
            model=OFFLINE_MODEL_NAME,
            object="response",
            output=items,
            tool_choice="auto",
            tools=[],
            top_p=None,
            parallel_tool_calls=True,
            status="completed",
            usage=ResponseUsage(
                input_tokens=in_tokens,
                output_tokens=out_tokens,
                total_tokens=in_tokens + out_tokens,
                input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
                output_tokens_details=OutputTokensDetails(
                    reasoning_tokens=_reasoning_tokens(items)
                ),
            ),
        )

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        response = self._respond(input, tools)
        usage = cast(ResponseUsage, response.usage)
        return ModelResponse(
            output=list(response.output),
            usage=Usage(
                requests=1,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                total_tokens=usage.total_tokens,
            ),
            response_id=response.id,
        )

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        response = self._respond(input, tools)
        delay = self.delay_ms / 1000
        deltas = 0
        for event in response_events(response):
            if isinstance(event, ResponseTextDeltaEvent | ResponseReasoningSummaryTextDeltaEvent):
                deltas += 1
                # Pace only the text, like a real model; structural events come back to back.
                if delay:
                    await asyncio.sleep(delay)
                elif deltas % YIELD_EVERY_DELTAS == 0:
                    # Unpaced, a long story would hold the event loop; let other runs in.
                    await asyncio.sleep(0)
            yield event


class OfflineModelProvider(ModelProvider):
    """Serves the offline demo model under any model name (the model is stateless)."""

    def __init__(self, delay_ms: int = 15) -> None:
        self._model = OfflineDemoModel(delay_ms)

    def get_model(self, model_name: str | None) -> Model:
        return self._model


# --------------------------------------------------------------------------------------------
# The agent graph.
# --------------------------------------------------------------------------------------------


def build_demo_agent(model: str | Model | None = None) -> Agent[Any]:
    """A fresh `assistant` agent; `model=None` leaves the choice to the run's model provider."""
    kwargs: dict[str, Any] = {} if model is None else {"model": model}
    return Agent(
        name=DEMO_AGENT_NAME,
        instructions=INSTRUCTIONS,
        tools=demo_tools(),
        **kwargs,
    )


def _small_refund_by_support(arguments: Mapping[str, Any], caller: RunCaller) -> Verdict | None:
    """Support staff may refund up to 50 without a reviewer; anything else waits for one."""
    amount = arguments.get("amount")
    if "support" not in caller.roles or not isinstance(amount, int | float):
        return None
    return "approve" if 0 < amount <= SUPPORT_REFUND_LIMIT else None


# The demo's approval rule (docs/protocol.md §9): refunds up to 50 asked for by a `support` user.
SUPPORT_REFUND_LIMIT = 50
REFUND_UP_TO_50 = ApprovalRule(
    "refund_up_to_50", _small_refund_by_support, caller_roles=frozenset({"support"})
)


def demo_graph(model: str | Model | None = None) -> AgentGraph:
    return AgentGraph(
        name=DEMO_AGENT_NAME,
        version=DEMO_AGENT_VERSION,
        build=lambda: build_demo_agent(model),
        # The "send this email?" confirmation: the run's own user may confirm it, and so may a
        # reviewer (docs/protocol.md §9).
        decided_by={"send_email": DecidedBy.EITHER},
        approval_rules={"issue_refund": REFUND_UP_TO_50},
        # A reviewer may approve a refund for another amount or order (docs/protocol.md §9).
        editable_arguments=frozenset({"issue_refund"}),
    )
