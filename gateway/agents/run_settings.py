"""A graph's settings for its runs: the parts of the SDK's `RunConfig` (and its hooks) that are
the graph's to choose (docs/agents.md "Run settings").

The gateway keeps what makes runs work the same everywhere: the model provider (not stored in
a checkpoint, so passed again on every restore) and whether traces leave the machine. A graph
chooses its hooks, guardrails, model settings and trace names, from the run's caller, and gets
them on the run's first segment and on every continuation alike. Traces are grouped by thread
(`group_id`) and carry the run, the thread and the agent in their metadata unless the graph
says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents import InputGuardrail, ModelSettings, OutputGuardrail, RunConfig, RunHooks
from agents.models.interface import ModelProvider

from gateway.agents.run_caller import RunCaller


@dataclass(frozen=True)
class RunSettings:
    hooks: RunHooks[Any] | None = None
    # Run on the run's input (the starting agent's turn) and on its final output; a tripwire
    # ends the run with `run.failed` code `guardrail_tripped` naming the guardrail.
    input_guardrails: tuple[InputGuardrail[Any], ...] = ()
    output_guardrails: tuple[OutputGuardrail[Any], ...] = ()
    model_settings: ModelSettings | None = None
    # None: the graph's name.
    workflow_name: str | None = None
    # Added to the gateway's own (`run_id`, `thread_id`, `agent`); the graph's win.
    trace_metadata: dict[str, Any] = field(default_factory=dict, hash=False)
    # None: the thread id, so a thread's runs are one group of traces.
    group_id: str | None = None


def run_config(
    settings: RunSettings, caller: RunCaller, *, provider: ModelProvider, tracing: bool
) -> RunConfig:
    """The `RunConfig` of one segment of the run `caller` describes."""
    metadata = {
        "run_id": caller.run_id,
        "thread_id": caller.thread_id,
        "agent": caller.agent,
        **settings.trace_metadata,
    }
    return RunConfig(
        model_provider=provider,
        tracing_disabled=not tracing,
        model_settings=settings.model_settings,
        input_guardrails=list(settings.input_guardrails) or None,
        output_guardrails=list(settings.output_guardrails) or None,
        workflow_name=settings.workflow_name or caller.agent,
        group_id=settings.group_id or caller.thread_id,
        trace_metadata=metadata,
    )
