"""Agent graphs for tests, driven by the SDK's ScriptedModel.

Tools record every execution in an `EffectLog`, so tests can count side effects exactly.
`registry()` is also importable by a gateway subprocess (`--agents tests.support.agents:registry`);
there the effect log is a file named by TEST_EFFECTS_FILE.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents import Agent, FunctionTool, handoff
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from openai.types.responses import ResponseOutputMessage, ResponseOutputRefusal

from gateway.agents.demo.assistant import demo_graph
from gateway.agents.exactly_once import Policy, run_once
from gateway.agents.registry import AgentGraph, AgentRegistry


@dataclass
class EffectLog:
    """Where test tools record that they ran (in memory, or appended to a file)."""

    path: Path | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def record(self, tool: str, arguments: dict[str, Any]) -> None:
        entry = {"tool": tool, "arguments": arguments}
        self.calls.append(entry)
        if self.path is not None:
            with self.path.open("a") as handle:
                handle.write(json.dumps(entry) + "\n")

    def count(self, tool: str) -> int:
        if self.path is not None and self.path.exists():
            lines = self.path.read_text().splitlines()
            return sum(1 for line in lines if json.loads(line)["tool"] == tool)
        return sum(1 for call in self.calls if call["tool"] == tool)


def effect_tool(
    effects: EffectLog, name: str, *, needs_approval: bool, output: str | None = None
) -> FunctionTool:
    """A tool taking free-form JSON arguments that records each run and returns a fixed text."""

    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        arguments = json.loads(raw or "{}")

        def effect(key: str) -> str:
            effects.record(name, arguments)
            return output or f"{name} done with {json.dumps(arguments, sort_keys=True)}"

        # Through the operation ledger, as a real side-effecting tool would be.
        return await run_once(ctx, effect, policy=Policy.RECONCILE, tool_name=name)

    return FunctionTool(
        name=name,
        description=f"test tool {name}",
        params_json_schema={
            "type": "object",
            "properties": {"value": {"type": "string"}},
            "required": [],
            "additionalProperties": True,
        },
        on_invoke_tool=invoke,
        strict_json_schema=False,
        needs_approval=needs_approval,
    )


def call(name: str, call_id: str, **arguments: Any) -> Any:
    return function_call(name, arguments, call_id=call_id)


def say(text: str) -> Any:
    return assistant_message(text)


def refuse(text: str, message_id: str = "msg_refusal") -> Any:
    """A model's refusal: an output message whose only content is `refusal`, streamed as
    refusal deltas, which carry no output text."""
    return ResponseOutputMessage(
        id=message_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputRefusal(type="refusal", refusal=text)],
    )


def scripted_graph(
    name: str,
    steps: Sequence[Any],
    effects: EffectLog,
    *,
    tools: Sequence[tuple[str, bool]] = (("charge", True), ("lookup", False)),
    version: str = "1",
) -> tuple[AgentGraph, ScriptedModel]:
    model = ScriptedModel(list(steps))

    def build() -> Agent[Any]:
        return Agent(
            name=name,
            instructions="test agent",
            model=model,
            tools=[effect_tool(effects, tool, needs_approval=gated) for tool, gated in tools],
        )

    return AgentGraph(name=name, version=version, build=build), model


def nested_graph(effects: EffectLog) -> tuple[AgentGraph, ScriptedModel, ScriptedModel]:
    """`outer` calls the agent-tool `ask_billing`; the inner `billing` agent calls `charge`."""
    outer_model = ScriptedModel(
        [
            ModelStep(output=[call("ask_billing", "call_outer_1", input="charge 5")]),
            ModelStep(output=[say("outer done: billing said OK")]),
        ]
    )
    inner_model = ScriptedModel(
        [
            ModelStep(output=[call("charge", "call_inner_1", value="5")]),
            ModelStep(output=[say("billing OK")]),
        ]
    )

    def build() -> Agent[Any]:
        billing = Agent(
            name="billing",
            instructions="billing",
            model=inner_model,
            tools=[effect_tool(effects, "charge", needs_approval=True)],
        )
        return Agent(
            name="outer",
            instructions="outer",
            model=outer_model,
            tools=[billing.as_tool(tool_name="ask_billing", tool_description="billing agent")],
        )

    return AgentGraph(name="outer", version="1", build=build), outer_model, inner_model


def handoff_graph(effects: EffectLog) -> tuple[AgentGraph, ScriptedModel, ScriptedModel]:
    """`triage` hands off to `refunds`, which calls `charge` (needs approval)."""
    triage_model = ScriptedModel([ModelStep(output=[call("transfer_to_refunds", "call_h1")])])
    refunds_model = ScriptedModel(
        [
            ModelStep(output=[say("refunds here"), call("charge", "call_r1", value="7")]),
            ModelStep(output=[say("refunds finished")]),
        ]
    )

    def build() -> Agent[Any]:
        refunds = Agent(
            name="refunds",
            instructions="refunds",
            model=refunds_model,
            tools=[effect_tool(effects, "charge", needs_approval=True)],
        )
        return Agent(
            name="triage",
            instructions="triage",
            model=triage_model,
            handoffs=[handoff(refunds)],
        )

    return AgentGraph(name="triage", version="1", build=build), triage_model, refunds_model


def charge_per_input(ask: Callable[[str], list[Any]], final: str) -> ScriptedModel:
    """A model for a gateway subprocess, good for 200 turns: every input gets `ask(call_id)`
    (items ending in the one `charge` call), and once that call's output is in, `final`."""

    def respond(model_call: Any) -> Any:
        items = model_call.input if isinstance(model_call.input, list) else []
        has_output = any(
            (item.get("type") if isinstance(item, dict) else None) == "function_call_output"
            for item in items[-3:]
        )
        if has_output:
            return [say(final)]
        return ask(f"call_{len(items)}")

    return ScriptedModel([ModelStep.respond(respond) for _ in range(200)])


def registry() -> AgentRegistry:
    """For gateway subprocesses: the demo agent plus a side-effect-counting `effects` graph.

    `effects` answers every input with one approval-gated `charge` call and, after its output,
    a final message; each execution of `charge` is appended to TEST_EFFECTS_FILE.
    """
    path = os.environ.get("TEST_EFFECTS_FILE")
    effects = EffectLog(Path(path) if path else None)

    def ask(call_id: str) -> list[Any]:
        return [say("charging now"), call("charge", call_id, value="1")]

    def build() -> Agent[Any]:
        return Agent(
            name="effects",
            instructions="effects",
            model=charge_per_input(ask, "charged and finished"),
            tools=[effect_tool(effects, "charge", needs_approval=True)],
        )

    return AgentRegistry(
        [demo_graph("offline"), AgentGraph(name="effects", version="1", build=build)],
        default="assistant",
    )


# The value `vault` passes as its sensitive `card` argument: no input or output repeats it.
VAULT_CARD = "4000-0566-5566-5556-vault-card"


def sensitive_registry() -> AgentRegistry:
    """For gateway subprocesses: the demo agent plus `vault`, whose `charge` argument `card`
    is sensitive.

    `vault` answers every input with one approval-gated `charge` call with `card=VAULT_CARD`,
    then a final message; neither that message nor the tool's output repeats the card, so the
    only copies of it are the ones the gateway must keep out of sight.
    """
    effects = EffectLog()

    def ask(call_id: str) -> list[Any]:
        return [call("charge", call_id, card=VAULT_CARD, value="1")]

    def build() -> Agent[Any]:
        return Agent(
            name="vault",
            instructions="vault",
            model=charge_per_input(ask, "the card was charged"),
            tools=[effect_tool(effects, "charge", needs_approval=True, output="charged")],
        )

    vault = AgentGraph(
        name="vault",
        version="1",
        build=build,
        sensitive_arguments={"charge": frozenset({"card"})},
    )
    return AgentRegistry([demo_graph("offline"), vault], default="assistant")


def caller_registry() -> AgentRegistry:
    """For gateway subprocesses: the demo agent plus `whoami`, whose approval-gated tool
    `whoami` appends the run context it sees (the gateway's `RunCaller`, as JSON) to the file
    TEST_CALLER_FILE, then answers; a final message follows its output."""
    path = Path(os.environ["TEST_CALLER_FILE"])

    def record(line: str) -> None:
        with path.open("a") as handle:
            handle.write(line + "\n")

    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        record(json.dumps(ctx.context.to_json()))
        return "noted"

    whoami = FunctionTool(
        name="whoami",
        description="test tool whoami",
        params_json_schema={"type": "object", "properties": {}, "additionalProperties": True},
        on_invoke_tool=invoke,
        strict_json_schema=False,
        needs_approval=True,
    )

    def build() -> Agent[Any]:
        return Agent(
            name="whoami",
            instructions="whoami",
            model=charge_per_input(lambda call_id: [call("whoami", call_id)], "you are known"),
            tools=[whoami],
        )

    graph = AgentGraph(name="whoami", version="1", build=build)
    return AgentRegistry([demo_graph("offline"), graph], default="assistant")
