"""The metrics run hooks (gateway/observability/run_hooks.py): they time model and tool calls and
pass every callback on to the hooks they wrap."""

from __future__ import annotations

from typing import Any

from agents import Agent, RunContextWrapper, RunHooks, function_tool
from agents.tool_context import ToolContext
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.metrics import OTHER, GatewayMetrics
from gateway.observability.run_hooks import MetricsHooks


class Recording(RunHooks[Any]):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_llm_start(self, *args: Any) -> None:
        self.calls.append("llm_start")

    async def on_llm_end(self, *args: Any) -> None:
        self.calls.append("llm_end")

    async def on_tool_start(self, *args: Any) -> None:
        self.calls.append("tool_start")

    async def on_tool_end(self, *args: Any) -> None:
        self.calls.append("tool_end")

    async def on_agent_start(self, *args: Any) -> None:
        self.calls.append("agent_start")


def counts(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@function_tool
def lookup(order: int) -> str:
    """Look an order up."""
    return str(order)


async def test_calls_are_timed_and_passed_on() -> None:
    metrics = GatewayMetrics(agents=["assistant"])
    inner = Recording()
    hooks = MetricsHooks(metrics, inner)
    agent: Agent[Any] = Agent(name="assistant")
    stranger: Agent[Any] = Agent(name="stranger")
    context: RunContextWrapper[Any] = RunContextWrapper(context=None)
    await hooks.on_agent_start(context, agent)  # type: ignore[arg-type]
    for who in (agent, stranger):
        await hooks.on_llm_start(context, who, None, [])
        await hooks.on_llm_end(context, who, None)  # type: ignore[arg-type]
    # Two calls of one tool in flight at once, ended in the other order.
    first, second = (
        ToolContext(context=None, tool_name="lookup", tool_call_id=i, tool_arguments="{}")
        for i in ("c1", "c2")
    )
    await hooks.on_tool_start(first, agent, lookup)
    await hooks.on_tool_start(second, agent, lookup)
    await hooks.on_tool_end(second, agent, lookup, "2")
    await hooks.on_tool_end(first, agent, lookup, "1")
    # An end without its start (a segment restored mid-call) times nothing.
    await hooks.on_tool_end(first, agent, lookup, "1")

    samples = counts(metrics)
    assert samples[("gateway_model_call_seconds_count", (("agent", "assistant"),))] == 1
    # A name the registry does not list is counted as `other`.
    assert samples[("gateway_model_call_seconds_count", (("agent", OTHER),))] == 1
    assert samples[("gateway_tool_call_seconds_count", (("tool", "lookup"),))] == 2
    model = ["llm_start", "llm_end"] * 2
    tools = ["tool_start", "tool_start", "tool_end", "tool_end", "tool_end"]
    assert inner.calls == ["agent_start", *model, *tools]
