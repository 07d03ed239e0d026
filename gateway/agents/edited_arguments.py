"""Approving a call with edited arguments (docs/protocol.md §4 `approval.decide`, `arguments`).

openai-agents 0.24's `RunState` approves a call only as the model made it, and refuses one whose
arguments changed after the pause (docs/architecture.md "SDK behaviours"). So the edit is made at
the tool: a graph names the tools whose calls a reviewer may approve with other arguments
(`AgentGraph.editable_arguments`), and those tools of its agent are wrapped when the agent is
built. A wrapped tool invoked for a call approved with an edit runs with the edited arguments
instead of the model's; its output begins with a line that tells the model the reviewer changed
them, and to what, so the model's next turn knows what was really done. The model's own call
stays in the history as it made it.

Which calls carry an edit rides in a ContextVar set by the segment for its task (as the
operation ledger's scope does, gateway/agents/exactly_once.py); the tool tasks the SDK starts
copy it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

import orjson
from agents import Agent, FunctionTool
from agents.tool_context import ToolContext
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from gateway.protocol.error_codes import CodedError, ErrorCode

# call id -> the edited arguments as JSON text, for the segment running now.
current_edits: ContextVar[Mapping[str, str]] = ContextVar(
    "gateway_edited_arguments", default=MappingProxyType({})
)


class EditRefused(CodedError, ValueError):
    """Edited arguments the tool cannot take; the message says why (never echoing values)."""

    CODE = ErrorCode.BAD_REQUEST


def edit_note(arguments: str) -> str:
    """The line the model reads before the output of a call run with edited arguments."""
    return f"[A reviewer approved this call with changed arguments: {arguments}]"


def editable(tool: FunctionTool) -> FunctionTool:
    """`tool`, running with the edited arguments of a call approved with an edit."""
    original = tool.on_invoke_tool

    async def invoke(ctx: ToolContext[Any], raw: str) -> Any:
        edited = current_edits.get().get(ctx.tool_call_id)
        if edited is None:
            return await original(ctx, raw)
        output = await original(ctx, edited)
        return f"{edit_note(edited)}\n{output}" if isinstance(output, str) else output

    return dataclasses.replace(tool, on_invoke_tool=invoke)


def with_editable_tools(agent: Agent[Any], names: frozenset[str]) -> Agent[Any]:
    """The agent with its function tools named in `names` made `editable`."""
    if not names:
        return agent
    tools = [
        editable(tool) if isinstance(tool, FunctionTool) and tool.name in names else tool
        for tool in agent.tools
    ]
    return agent.clone(tools=tools)


def checked_edit(agent: Agent[Any], tool_name: str, arguments: Any) -> dict[str, Any]:
    """`arguments` if the agent's tool `tool_name` takes them (its JSON schema), else
    `EditRefused`."""
    if not isinstance(arguments, dict):
        raise EditRefused("arguments must be a JSON object")
    tool = next(
        (t for t in agent.tools if isinstance(t, FunctionTool) and t.name == tool_name), None
    )
    if tool is None:
        raise EditRefused(f"tool {tool_name!r} takes no edited arguments")
    try:
        validator = Draft202012Validator(tool.params_json_schema)
        error = next(iter(validator.iter_errors(arguments)), None)
    except SchemaError:
        raise EditRefused(f"tool {tool_name!r} has no usable JSON schema") from None
    if error is not None:
        # Where and which rule, not the offending value (arguments may be sensitive).
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        raise EditRefused(
            f"arguments do not fit tool {tool_name!r}: {where} fails '{error.validator}'"
        )
    return arguments


def edits_of(approved: Mapping[str, Any]) -> Mapping[str, str]:
    """call id -> edited arguments as the JSON text a tool is invoked with."""
    return MappingProxyType(
        {call_id: orjson.dumps(arguments).decode() for call_id, arguments in approved.items()}
    )
