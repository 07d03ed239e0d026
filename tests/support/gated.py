"""A ScriptedModel graph for approval tests: every input asks for approval-gated calls.

The final answer quotes each call's output verbatim, so a rejection message (or an expiry
reason) is visible in `run.completed`; it serves any number of runs and threads.
"""

from __future__ import annotations

import itertools
from typing import Any

from agents import Agent
from agents.testing import ModelStep, ScriptedModel

from gateway.agents.approval_rules import ApprovalRule
from gateway.agents.registry import AgentGraph
from tests.support.agents import EffectLog, call, effect_tool, say


def gated_graph(
    effects: EffectLog,
    *,
    name: str = "gated",
    tool: str = "charge",
    reviewer_roles: dict[str, frozenset[str]] | None = None,
    decided_by: dict[str, str] | None = None,
    approval_rules: dict[str, ApprovalRule] | None = None,
    calls: int = 1,
) -> AgentGraph:
    """Each input gets `calls` approval-gated `tool` calls in one model response, with the
    arguments `{"value": "<input>", "n": i}`; once their outputs are in, the model answers
    `finished: <output> | <output> ...`."""
    batches = itertools.count(1)

    def respond(model_call: Any) -> Any:
        items = model_call.input if isinstance(model_call.input, list) else []
        outputs: list[str] = []
        for item in reversed(items):
            if not isinstance(item, dict) or item.get("type") != "function_call_output":
                break
            outputs.insert(0, str(item.get("output")))
        if outputs:
            return [say("finished: " + " | ".join(outputs))]
        last = items[-1] if items else {}
        text = last.get("content") if isinstance(last, dict) else None
        value = text if isinstance(text, str) else str(model_call.input)
        batch = next(batches)
        return [call(tool, f"call_{batch}_{i}", value=value, n=i) for i in range(calls)]

    def build() -> Agent[Any]:
        return Agent(
            name=name,
            instructions="gated",
            model=ScriptedModel([ModelStep.respond(respond) for _ in range(500)]),
            tools=[effect_tool(effects, tool, needs_approval=True)],
        )

    return AgentGraph(
        name=name,
        version="1",
        build=build,
        reviewer_roles=reviewer_roles or {},
        decided_by=decided_by or {},
        approval_rules=approval_rules or {},
    )
