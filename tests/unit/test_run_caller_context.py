"""How a graph makes, saves and rebuilds its run context from the caller
(gateway/agents/registry.py, gateway/agents/run_caller.py), through a real SDK checkpoint round
trip, and the `RunConfig` its run settings give (gateway/agents/run_settings.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
import pytest
from agents import Agent, RunConfig, Runner
from agents.run_state import RunState

from gateway.agents.demo.assistant import OfflineModelProvider, build_demo_agent
from gateway.agents.registry import AgentGraph
from gateway.agents.run_caller import RunCaller
from gateway.agents.run_settings import RunSettings, run_config

CALLER = RunCaller(
    user="olga",
    tenant="acme",
    roles=frozenset({"user"}),
    claims={"email": "olga@example.com"},
    thread_id="t_1",
    run_id="r_1",
    agent="assistant",
)


@dataclass
class Ticket:
    caller: RunCaller
    priority: str


def ticket_json(ticket: Ticket) -> dict[str, Any]:
    return {"user": ticket.caller.user, "priority": ticket.priority}


def ticket_from(data: Mapping[str, Any], caller: RunCaller) -> Ticket:
    return Ticket(caller=caller, priority=data["priority"])


TYPED = AgentGraph(
    name="assistant",
    version="1",
    build=build_demo_agent,
    make_context=lambda caller: Ticket(caller=caller, priority="high"),
    context_serializer=ticket_json,
    context_deserializer=ticket_from,
)


async def paused_with(graph: AgentGraph, context: Any) -> str:
    """A demo run paused for approval, saved as the gateway saves a checkpoint."""
    result = Runner.run_streamed(
        build_demo_agent(),
        "refund order 42 for 30",
        context=context,
        run_config=RunConfig(model_provider=OfflineModelProvider(0), tracing_disabled=True),
    )
    async for _ in result.stream_events():
        pass
    assert result.interruptions
    data = result.to_state().to_json(context_serializer=graph.serialize_context)
    return orjson.dumps(data).decode()


async def test_a_custom_context_round_trips_and_gets_the_caller_of_the_continuation() -> None:
    saved = await paused_with(TYPED, TYPED.new_context(CALLER))
    # Restored in advance (before any decision), the context stays the saved data.
    state: RunState[Any, Any] = await RunState.from_string(
        build_demo_agent(), saved, context_deserializer=TYPED.restore_context
    )
    assert state.get_interruptions()
    decided = replace(CALLER, decided_by="rex")
    resumed = TYPED.resumed_context(saved, decided)
    assert resumed == Ticket(caller=decided, priority="high")


async def test_without_a_factory_the_caller_is_the_context_and_is_saved() -> None:
    graph = AgentGraph(name="assistant", version="1", build=build_demo_agent)
    context = graph.new_context(CALLER)
    assert context is CALLER
    saved = await paused_with(graph, context)
    assert orjson.loads(saved)["context"]["context"] == CALLER.to_json()
    decided = replace(CALLER, decided_by="rex")
    assert graph.resumed_context(saved, decided) is decided


async def test_factories_and_deserializers_without_the_caller_keep_working() -> None:
    graph = AgentGraph(
        name="assistant",
        version="1",
        build=build_demo_agent,
        make_context=lambda: {"tier": "standard"},
        context_deserializer=lambda data: dict(data),
    )
    context = graph.new_context(CALLER)
    assert context == {"tier": "standard"}
    saved = await paused_with(graph, context)
    state: RunState[Any, Any] = await RunState.from_string(
        build_demo_agent(), saved, context_deserializer=graph.restore_context
    )
    assert state.get_interruptions()
    # The state's own context is kept: the continuation passes none of its own.
    assert graph.resumed_context(saved, CALLER) is None


def test_run_settings_group_traces_by_thread_and_name_the_run() -> None:
    provider = OfflineModelProvider(0)
    config = run_config(RunSettings(), CALLER, provider=provider, tracing=False)
    assert config.model_provider is provider
    assert config.tracing_disabled is True
    assert config.group_id == "t_1"
    assert config.workflow_name == "assistant"
    assert config.trace_metadata == {"run_id": "r_1", "thread_id": "t_1", "agent": "assistant"}
    assert config.input_guardrails is None

    own = RunSettings(workflow_name="support", trace_metadata={"agent": "desk", "queue": "eu"})
    config = run_config(own, CALLER, provider=provider, tracing=True)
    assert config.tracing_disabled is False
    assert config.workflow_name == "support"
    assert config.trace_metadata == {
        "run_id": "r_1",
        "thread_id": "t_1",
        "agent": "desk",
        "queue": "eu",
    }


def test_a_settings_factory_must_return_run_settings() -> None:
    graph = AgentGraph(
        name="assistant",
        version="1",
        build=lambda: Agent(name="assistant"),
        run_settings=lambda caller: {"workflow_name": "x"},  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(TypeError, match="not RunSettings"):
        graph.settings_for(CALLER)
