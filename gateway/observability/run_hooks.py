"""Model and tool call metrics from the SDK's run hooks (docs/operations.md, "Metrics").

The hooks are where the SDK itself brackets each model call and each local tool call; timing
them from the stream instead would need the translation to pair start and end events it does
not otherwise look at. One `MetricsHooks` serves one segment (the starts it has not seen end
go with it), and it passes every callback on to `inner`, so hooks a deployment supplies still
run with the metrics ones.
"""

from __future__ import annotations

import time
from typing import Any

from agents import Agent, RunContextWrapper, RunHooks, Tool
from agents.items import ModelResponse, TResponseInputItem
from agents.run_context import AgentHookContext

from gateway.observability.metrics import GatewayMetrics


class MetricsHooks(RunHooks[Any]):
    def __init__(self, metrics: GatewayMetrics, inner: RunHooks[Any] | None = None) -> None:
        self._metrics = metrics
        self._inner = inner
        # One model call at a time per agent of a run; tools of one turn run concurrently.
        self._model_started: dict[str, float] = {}
        self._tool_started: dict[str, float] = {}

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        self._model_started[agent.name] = time.perf_counter()
        if self._inner is not None:
            await self._inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        started = self._model_started.pop(agent.name, None)
        if started is not None:
            self._metrics.model_call(agent.name, time.perf_counter() - started)
        if self._inner is not None:
            await self._inner.on_llm_end(context, agent, response)

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        self._tool_started[_call_key(context, tool)] = time.perf_counter()
        if self._inner is not None:
            await self._inner.on_tool_start(context, agent, tool)

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object
    ) -> None:
        started = self._tool_started.pop(_call_key(context, tool), None)
        if started is not None:
            self._metrics.tool_call(tool.name, time.perf_counter() - started)
        if self._inner is not None:
            await self._inner.on_tool_end(context, agent, tool, result)

    async def on_agent_start(self, context: AgentHookContext[Any], agent: Agent[Any]) -> None:
        if self._inner is not None:
            await self._inner.on_agent_start(context, agent)

    async def on_agent_end(
        self, context: AgentHookContext[Any], agent: Agent[Any], output: Any
    ) -> None:
        if self._inner is not None:
            await self._inner.on_agent_end(context, agent, output)

    async def on_handoff(
        self, context: RunContextWrapper[Any], from_agent: Agent[Any], to_agent: Agent[Any]
    ) -> None:
        if self._inner is not None:
            await self._inner.on_handoff(context, from_agent, to_agent)


def _call_key(context: RunContextWrapper[Any], tool: Tool) -> str:
    # A function tool's context is a ToolContext naming its call; other tool families get the
    # run's context, and one call of each runs at a time.
    return str(getattr(context, "tool_call_id", None) or f"{tool.name}:{id(tool)}")
