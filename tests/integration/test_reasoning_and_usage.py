"""Reasoning summaries and token usage (docs/protocol.md §6): a scripted model that emits both,
and the real OpenAI provider path against a fake Responses API that streams reasoning summaries;
what the log holds, the run's totals, the metric, and what useChat's `Chat` shows of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from agents import Agent
from agents.testing import ModelStep, ScriptedModel
from agents.usage import Usage
from openai.types.responses.response_reasoning_item import ResponseReasoningItem, Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from gateway.agents.registry import AgentGraph, AgentRegistry
from tests.integration.test_sse import is_event, read_until
from tests.support.agents import EffectLog, call, effect_tool, say
from tests.support.client import Client, ProtocolFailure
from tests.support.fake_openai import running_fake_openai
from tests.support.gateway import Gateway
from tests.support.node_scripts import node_script


def usage(input_tokens: int, output_tokens: int, cached: int, reasoning: int) -> Usage:
    return Usage(
        requests=1,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=0),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
    )


def thinking(summary: list[str]) -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id="rs_1",
        type="reasoning",
        summary=[Summary(type="summary_text", text=text) for text in summary],
    )


def reasoning_registry() -> AgentRegistry:
    model = ScriptedModel(
        [
            ModelStep(
                output=[thinking(["Look the order up first."]), call("lookup", "c1", order=7)],
                usage=usage(100, 20, 40, 8),
            ),
            ModelStep(
                output=[thinking(["It shipped.", "Say so."]), say("Order 7 shipped.")],
                usage=usage(150, 30, 100, 12),
            ),
        ]
    )
    effects = EffectLog()

    def build() -> Agent[Any]:
        return Agent(
            name="thinker",
            instructions="test agent",
            model=model,
            tools=[effect_tool(effects, "lookup", needs_approval=False, output="shipped")],
        )

    return AgentRegistry([AgentGraph(name="thinker", version="1", build=build)])


async def test_a_scripted_model_s_reasoning_and_usage_are_logged(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(registry=reasoning_registry(), metrics=True) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        try:
            ack = await alice.request("run.start", input="where is order 7?")
            await alice.wait_event("run.completed")
            events = alice.events_of(ack["thread_id"])
        finally:
            await alice.close()
        async with gw.http() as http:
            scraped = (await http.get("/metrics")).text
            headers = {"Authorization": f"Bearer {gw.token('alice', 'user')}"}
            run = (await http.get(f"/v1/runs/{ack['run_id']}", headers=headers)).json()["run"]
    names = [e["event"] for e in events]
    assert names.count("reasoning.started") == 2 and names.count("model.usage") == 2
    # A summary streams like a message, before the model's output of that call.
    assert names.index("reasoning.completed") < names.index("tool.called")
    completed = [e["data"] for e in events if e["event"] == "reasoning.completed"]
    assert [c["text"] for c in completed] == ["Look the order up first.", "It shipped.\n\nSay so."]
    for reasoning in completed:
        deltas = [
            e["data"]["delta"]
            for e in events
            if e["event"] == "reasoning.delta"
            and e["data"]["reasoning_id"] == reasoning["reasoning_id"]
        ]
        assert "".join(deltas) == reasoning["text"]
    calls = [e["data"] for e in events if e["event"] == "model.usage"]
    assert [(c["input_tokens"], c["cached_tokens"], c["reasoning_tokens"]) for c in calls] == [
        (100, 40, 8),
        (150, 100, 12),
    ]
    assert all(c["agent"] == "thinker" for c in calls)
    totals = events[-1]["data"]["usage"]
    assert totals == {
        "requests": 2,
        "input_tokens": 250,
        "output_tokens": 50,
        "total_tokens": 300,
        "cached_tokens": 140,
        "reasoning_tokens": 20,
    }
    assert run["usage"] == totals
    assert 'gateway_model_tokens_total{agent="thinker",kind="reasoning"} 20.0' in scraped
    assert 'gateway_model_tokens_total{agent="thinker",kind="cached"} 140.0' in scraped


async def test_use_chat_shows_the_reasoning_and_the_message_s_usage(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(registry=reasoning_registry()) as gw:
        config = {
            "scenario": "stream",
            "transport": "ws",
            "base": gw.http_url,
            "token": gw.token("alice", "user"),
            "chatId": "thinking-chat",
            "text": "where is order 7?",
        }
        async with node_script("ai_sdk_chat.mjs", config) as script:
            result = await script.until("done", timeout_s=60)
        history = await messages_of(gw, "thinking-chat")
    message = result["messages"][-1]
    reasoning = [p["text"] for p in message["parts"] if p["type"] == "reasoning"]
    assert reasoning == ["Look the order up first.", "It shipped.\n\nSay so."]
    assert message["metadata"]["usage"]["requests"] == 2
    assert message["metadata"]["usage"]["reasoning_tokens"] == 20
    assert [p["type"] for p in history[1]["parts"]] == [p["type"] for p in message["parts"]]
    assert history[1]["metadata"]["usage"] == message["metadata"]["usage"]


async def messages_of(gw: Gateway, chat_id: str) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {gw.token('alice', 'user')}"}
    async with httpx.AsyncClient(base_url=gw.http_url, timeout=10) as http:
        answer = await http.get(f"/v1/ai-sdk/chat/{chat_id}/messages", headers=headers)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["messages"])


async def test_reasoning_summaries_streamed_by_an_openai_compatible_server(
    gateway_factory: Callable[..., Any],
) -> None:
    async with (
        running_fake_openai() as (_fake, port),
        gateway_factory(
            openai_api_key="sk-test", openai_base_url=f"http://127.0.0.1:{port}/v1", model="gpt-x"
        ) as gw,
    ):
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        try:
            ack = await alice.request("run.start", input="think about this")
            await alice.wait_event("run.completed")
            events = alice.events_of(ack["thread_id"])
        finally:
            await alice.close()
    names = [e["event"] for e in events]
    assert names.index("reasoning.started") < names.index("message.started")
    summary = next(e["data"]["text"] for e in events if e["event"] == "reasoning.completed")
    assert summary == "The user wants me to think it over.\n\nQuoting them back is enough."
    deltas = [e["data"]["delta"] for e in events if e["event"] == "reasoning.delta"]
    assert len(deltas) > 5 and "".join(deltas) == summary
    used = next(e["data"] for e in events if e["event"] == "model.usage")
    assert used["model"] == "gpt-x" and used["reasoning_tokens"] == 13
    assert events[-1]["data"]["usage"]["reasoning_tokens"] == 13


async def test_a_client_may_leave_reasoning_and_usage_out(
    gateway_factory: Callable[..., Any],
) -> None:
    """`omit` in the hello: those events never reach the connection, live or replayed; the
    frame after them says which seq it follows, so the client sees no gap."""
    async with gateway_factory(registry=reasoning_registry()) as gw:
        token = gw.token("alice", "user")
        lean = await Client.connect(gw.ws_url, token, hello={"omit": ["reasoning", "usage"]})
        full = await Client.connect(gw.ws_url, token)
        try:
            assert lean.welcome["omit"] == ["reasoning", "usage"]
            assert "omit" not in full.welcome
            started = await lean.request("run.start", input="where is order 7?")
            thread_id = started["thread_id"]
            await full.request("thread.subscribe", thread_id=thread_id, after_seq=0)
            await lean.wait_event("run.completed")
            await full.wait_event("run.completed")
            live = lean.events_of(thread_id)
            everything = full.events_of(thread_id)
            # Replayed from the start on a new connection: the same frames as live.
            again = await Client.connect(gw.ws_url, token, hello={"omit": ["reasoning", "usage"]})
            try:
                await again.request("thread.subscribe", thread_id=thread_id, after_seq=0)
                await again.wait_event("run.completed")
                replayed = again.events_of(thread_id)
            finally:
                await again.close()
        finally:
            await lean.close()
            await full.close()
    left_out = {"reasoning.started", "reasoning.delta", "reasoning.completed", "model.usage"}
    assert left_out <= {e["event"] for e in everything}
    kept = [e for e in everything if e["event"] not in left_out]
    for received in (live, replayed):
        assert [e["seq"] for e in received] == [e["seq"] for e in kept]
        assert not left_out & {e["event"] for e in received}
        # Each frame follows the one before it: directly, or by its prev_seq.
        previous = 0
        for frame in received:
            assert frame.get("prev_seq", frame["seq"] - 1) == previous, frame
            assert ("prev_seq" in frame) == (frame["seq"] - 1 != previous)
            previous = frame["seq"]
        assert any("prev_seq" in frame for frame in received)
    assert all("prev_seq" not in frame for frame in everything)


async def test_an_unknown_kind_to_omit_is_refused(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(registry=reasoning_registry()) as gw:
        with pytest.raises(ProtocolFailure) as refused:
            await Client.connect(gw.ws_url, gw.token("alice", "user"), hello={"omit": ["text"]})
    assert refused.value.code == "bad_request"


async def test_the_sse_feed_may_leave_them_out_too(gateway_factory: Callable[..., Any]) -> None:
    """`omit=reasoning` on the thread's feed: the same rule as a hello's, `prev_seq` included;
    an unknown kind is a 400 before anything streams."""
    async with gateway_factory(registry=reasoning_registry()) as gw:
        token = gw.token("alice", "user")
        alice = await Client.connect(gw.ws_url, token)
        try:
            started = await alice.request("run.start", input="where is order 7?")
            await alice.wait_event("run.completed")
            everything = alice.events_of(started["thread_id"])
        finally:
            await alice.close()
        headers = {"Authorization": f"Bearer {token}"}
        path = f"/v1/threads/{started['thread_id']}/stream"
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=10) as http:
            refused = await http.get(path, headers=headers, params={"omit": "reasoning,text"})
            assert refused.status_code == 400, refused.text
            _, received = await read_until(
                http, path, headers, is_event("run.completed"), params={"omit": "reasoning"}
            )
    reasoning = {"reasoning.started", "reasoning.delta", "reasoning.completed"}
    kept = [e for e in everything if e["event"] not in reasoning]
    assert [e["seq"] for e in received] == [e["seq"] for e in kept]
    assert "model.usage" in {e["event"] for e in received}
    previous = 0
    for frame in received:
        assert frame.get("prev_seq", frame["seq"] - 1) == previous, frame
        previous = frame["seq"]
    assert any("prev_seq" in frame for frame in received)
