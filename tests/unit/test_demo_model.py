"""The offline demo agent, driven through the real SDK runner (docs/protocol.md §9)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, RunState
from agents.items import ToolApprovalItem
from agents.model_settings import ModelSettings
from agents.models.interface import ModelTracing
from agents.models.multi_provider import MultiProvider
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_provider import OpenAIProvider
from agents.models.openai_responses import OpenAIResponsesModel
from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent

from gateway.agents.demo.assistant import (
    DEFAULT_EMAIL,
    OfflineDemoModel,
    OfflineModelProvider,
    build_demo_agent,
    demo_graph,
    order_status_text,
    refund_text,
)
from gateway.agents.model_providers import build_model_provider, default_model_name

RUN_CONFIG = RunConfig(model_provider=OfflineModelProvider(0), tracing_disabled=True)


@dataclass
class Streamed:
    """What one streamed run produced, collected from its events."""

    result: Any
    deltas: list[str] = field(default_factory=list)
    raw_types: list[str] = field(default_factory=list)
    item_events: list[str] = field(default_factory=list)

    @property
    def model_calls(self) -> int:
        return self.raw_types.count("response.completed")

    @property
    def interruptions(self) -> list[ToolApprovalItem]:
        return list(self.result.interruptions)


async def run(agent: Agent[Any], input: Any) -> Streamed:
    result = Runner.run_streamed(agent, input, run_config=RUN_CONFIG)
    out = Streamed(result)
    async for event in result.stream_events():
        if isinstance(event, RawResponsesStreamEvent):
            out.raw_types.append(event.data.type)
            if event.data.type == "response.output_text.delta":
                out.deltas.append(event.data.delta)
        elif isinstance(event, RunItemStreamEvent):
            out.item_events.append(event.name)
    return out


def args_of(item: ToolApprovalItem) -> dict[str, Any]:
    return json.loads(item.arguments or "{}")


async def test_plain_reply_quotes_input_and_deltas_rebuild_the_text() -> None:
    text = "Hello   there,\nhow are you?"
    out = await run(build_demo_agent(), text)
    assert text in out.result.final_output
    assert "".join(out.deltas) == out.result.final_output
    assert len(out.deltas) > 3
    assert out.interruptions == []
    assert out.raw_types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]


async def test_story_is_long_streamed_and_deterministic() -> None:
    first = await run(build_demo_agent(), "Tell me a STORY about a harbour")
    story = first.result.final_output
    assert len(story.split()) >= 200
    assert len(first.deltas) >= 200
    assert "".join(first.deltas) == story
    assert "tool_called" not in first.item_events
    again = await run(build_demo_agent(), "Tell me a STORY about a harbour")
    assert again.result.final_output == story
    other = await run(build_demo_agent(), "a story about mountains")
    assert other.result.final_output != story


async def test_refund_pauses_for_approval_and_approval_runs_the_tool() -> None:
    agent = build_demo_agent()
    out = await run(agent, "Refund order 42 for 30 dollars")
    assert out.result.final_output is None
    [item] = out.interruptions
    assert item.tool_name == "issue_refund"
    assert args_of(item) == {"order_id": 42, "amount": 30.0}
    assert item.call_id and item.call_id.startswith("call_")
    assert "".join(out.deltas).strip()  # the short sentence before the call was streamed

    state = out.result.to_state()
    state.approve(item)
    resumed = await run(agent, state)
    assert resumed.item_events[0] == "tool_output"
    assert refund_text(42, 30.0) in resumed.result.final_output
    assert "".join(resumed.deltas) == resumed.result.final_output


async def test_rejection_message_appears_verbatim() -> None:
    agent = build_demo_agent()
    out = await run(agent, "please refund order 7")
    [item] = out.interruptions
    assert args_of(item) == {"order_id": 7, "amount": 10.0}
    state = out.result.to_state()
    message = "Refunds over the weekend are not allowed (ticket #12)."
    state.reject(item, rejection_message=message)
    resumed = await run(agent, state)
    assert message in resumed.result.final_output
    assert "Refund of" not in resumed.result.final_output


async def test_refund_and_email_are_two_calls_in_one_response() -> None:
    agent = build_demo_agent()
    out = await run(agent, "Refund order 5 for 12.50 and EMAIL bob@example.com")
    assert out.model_calls == 1
    refund, email = out.interruptions
    assert (refund.tool_name, email.tool_name) == ("issue_refund", "send_email")
    assert args_of(refund) == {"order_id": 5, "amount": 12.5}
    assert args_of(email)["to"] == "bob@example.com"
    assert refund.call_id != email.call_id

    state = out.result.to_state()
    state.approve(refund)
    state.approve(email)
    resumed = await run(agent, state)
    final = resumed.result.final_output
    assert refund_text(5, 12.5) in final
    assert f"Email sent to bob@example.com: {args_of(email)['subject']}" in final


async def test_email_without_address_uses_default() -> None:
    out = await run(build_demo_agent(), "send an email please")
    [item] = out.interruptions
    assert item.tool_name == "send_email"
    assert args_of(item)["to"] == DEFAULT_EMAIL


async def test_status_takes_one_turn_per_order_then_answers() -> None:
    out = await run(build_demo_agent(), "What is the status of 3 and 7?")
    assert out.interruptions == []
    assert out.model_calls == 3
    assert out.item_events.count("tool_output") == 2
    final = out.result.final_output
    assert order_status_text(3) in final
    assert order_status_text(7) in final
    assert final.index(order_status_text(3)) < final.index(order_status_text(7))


async def test_status_without_numbers_checks_order_one_and_caps_at_five() -> None:
    single = await run(build_demo_agent(), "status?")
    assert single.model_calls == 2
    assert order_status_text(1) in single.result.final_output
    many = await run(build_demo_agent(), "status 1 2 3 4 5 6 7")
    assert many.model_calls == 6
    assert order_status_text(6) not in many.result.final_output


async def test_checkpoint_round_trip_with_fresh_agent() -> None:
    out = await run(build_demo_agent(), "refund order 42 for 30 dollars")
    serialized = out.result.to_state().to_string()

    fresh = build_demo_agent()
    restored = await RunState.from_string(fresh, serialized)
    [item] = restored.get_interruptions()
    assert item.tool_name == "issue_refund"
    restored.approve(item)
    resumed = await run(fresh, restored)
    assert refund_text(42, 30.0) in resumed.result.final_output


async def test_newest_user_message_decides() -> None:
    history = [
        {"role": "user", "content": "refund order 1"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": [{"type": "input_text", "text": "just saying hi"}]},
    ]
    out = await run(build_demo_agent(), history)
    assert out.interruptions == []
    assert "just saying hi" in out.result.final_output


async def test_get_response_matches_streamed_rules() -> None:
    model = OfflineDemoModel(delay_ms=0)
    response = await model.get_response(
        None,
        "refund order 9 and email a@b.io",
        ModelSettings(),
        list(build_demo_agent().tools),
        None,
        [],
        ModelTracing.DISABLED,
        previous_response_id=None,
        conversation_id=None,
        prompt=None,
    )
    kinds = [getattr(item, "type", None) for item in response.output]
    assert kinds == ["message", "function_call", "function_call"]
    assert response.usage.requests == 1


async def test_agent_without_demo_tools_gets_text_instead_of_calls() -> None:
    out = await run(Agent(name="other"), "refund order 3")
    assert out.interruptions == []
    assert "refund order 3" in out.result.final_output


def test_graph_and_provider_selection() -> None:
    graph = demo_graph()
    assert (graph.name, graph.version) == ("assistant", "1")
    agent = graph.build()
    assert agent.name == "assistant"
    assert {tool.name for tool in agent.tools} == {"get_order_status", "issue_refund", "send_email"}
    again = graph.build()
    assert again is not agent
    assert all(a is not b for a, b in zip(agent.tools, again.tools, strict=True))

    offline = build_model_provider(
        model="offline", delay_ms=0, openai_api_key=None, openai_base_url=None
    )
    assert isinstance(offline, OfflineModelProvider)
    assert isinstance(offline.get_model("anything"), OfflineDemoModel)
    online = build_model_provider(
        model="gpt-4.1-mini", delay_ms=0, openai_api_key="sk-test", openai_base_url=None
    )
    # The SDK's multi-provider (prefixes such as litellm/ route), on the gateway's own client.
    assert isinstance(online, MultiProvider)
    assert isinstance(online.openai_provider, OpenAIProvider)
    assert isinstance(online.get_model("openai/gpt-4.1-mini"), OpenAIResponsesModel)
    chat = build_model_provider(
        model="m",
        delay_ms=0,
        openai_api_key=None,
        openai_base_url="http://127.0.0.1:9/v1",
        openai_api="chat_completions",
    )
    assert isinstance(chat.get_model("m"), OpenAIChatCompletionsModel)

    assert default_model_name(None, None) == "offline"
    assert default_model_name("sk-test", None) not in ("", "offline")
    assert default_model_name("sk-test", "offline") == "offline"
    assert default_model_name(None, "gpt-x") == "gpt-x"


@pytest.mark.parametrize("delay_ms", [0, 2])
async def test_delay_paces_text_only(delay_ms: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.agents.demo.assistant as demo

    sleeps: list[float] = []
    real_sleep = demo.asyncio.sleep

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(demo.asyncio, "sleep", fake_sleep)
    model = OfflineDemoModel(delay_ms=delay_ms)
    deltas = 0
    async for event in model.stream_response(
        None,
        "one two three",
        ModelSettings(),
        [],
        None,
        [],
        ModelTracing.DISABLED,
        previous_response_id=None,
        conversation_id=None,
        prompt=None,
    ):
        deltas += event.type == "response.output_text.delta"
    assert deltas == 5  # 'You said: "one two three"'
    assert sleeps == ([delay_ms / 1000] * deltas if delay_ms else [])
