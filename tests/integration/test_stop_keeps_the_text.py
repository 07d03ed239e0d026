"""Stop keeps the text (docs/protocol.md §6 `message.aborted`): a run cancelled mid-message
leaves the streamed text in the log, in the history the agent sees on the next turn, and in
what useChat's history shows."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from agents import Agent
from agents.testing import ModelStep, ScriptedModel
from agents.testing.model import _stream_events_for_step

from gateway.agents.registry import AgentGraph, AgentRegistry
from tests.support.agents import say
from tests.support.client import Client

LONG = " ".join(f"word{i}" for i in range(200))


def slowly(step: ModelStep, pause_s: float) -> ModelStep:
    """`step` streamed with a pause after each event, so a stop lands mid-message."""

    async def events(_call: Any) -> AsyncIterator[Any]:
        for event in _stream_events_for_step(step, preserve_raw_usage=False):
            if getattr(event, "type", None) != "response.output_text.delta":
                yield event
                continue
            # Word by word, as a model streams.
            for word in re.findall(r"\S+\s*", event.delta):
                yield event.model_copy(update={"delta": word})
                await asyncio.sleep(pause_s)

    return ModelStep.stream(events, output=step.output)


def talker() -> tuple[AgentRegistry, ScriptedModel]:
    model = ScriptedModel(
        [slowly(ModelStep(output=[say(LONG)]), 0.005), ModelStep(output=[say("ok")])]
    )

    def build() -> Agent[Any]:
        return Agent(name="talker", instructions="test agent", model=model)

    return AgentRegistry([AgentGraph(name="talker", version="1", build=build)]), model


def history_texts(model_input: Any) -> list[tuple[str, str]]:
    """(role, text) of the items a model call was given."""
    items = [model_input] if isinstance(model_input, str) else list(model_input)
    texts = []
    for item in items:
        if isinstance(item, str):
            texts.append(("user", item))
            continue
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content)
        texts.append((str(item.get("role")), str(content)))
    return texts


async def test_a_stopped_message_keeps_its_text_for_the_next_turn(
    gateway_factory: Callable[..., Any],
) -> None:
    registry, model = talker()
    async with gateway_factory(registry=registry) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        try:
            ack = await alice.request("run.start", input="talk to me")
            thread_id, run_id = ack["thread_id"], ack["run_id"]
            for _ in range(20):
                await alice.wait_event("message.delta")
            await alice.request("run.cancel", run_id=run_id)
            await alice.wait_event("run.cancelled")
            events = alice.events_of(thread_id)
            streamed = "".join(e["data"]["delta"] for e in events if e["event"] == "message.delta")
            aborted = next(e["data"] for e in events if e["event"] == "message.aborted")
            # The log ends the message with what was streamed, marked as stopped.
            assert aborted["reason"] == "cancelled" and aborted["text"] == streamed
            assert 0 < len(streamed) < len(LONG)
            await alice.request("run.start", thread_id=thread_id, input="go on")
            await alice.wait_event("run.completed", timeout=10)
            async with httpx.AsyncClient(base_url=gw.http_url, timeout=10) as http:
                headers = {"Authorization": f"Bearer {gw.token('alice', 'user')}"}
                chat = await http.get(f"/v1/ai-sdk/chat/{thread_id}/messages", headers=headers)
        finally:
            await alice.close()
    # The agent's next turn sees the stopped text as the assistant's, after the first input.
    seen = history_texts(model.calls[1].input)
    assert seen[:3] == [("user", "talk to me"), ("assistant", streamed), ("user", "go on")]
    # useChat's history keeps it too.
    first_answer = chat.json()["messages"][1]
    assert [p.get("text") for p in first_answer["parts"] if p["type"] == "text"] == [streamed]
    assert first_answer["metadata"]["status"] == "cancelled"
