"""What openai-agents' `RunState` allows for approving a call with edited arguments
(docs/architecture.md "SDK behaviours": "Edited arguments"; issue 31 point 3).

The SDK has no public way to approve a call with other arguments: `approve(item,
always_approve=False)` takes none. Each call's invocation is fingerprinted over its arguments in
the state (`tool_invocations`, serialized with it), so a call whose arguments were changed after
the pause (on the interruption, on every copy, or in the checkpoint's JSON) makes `approve`
raise `ModelBehaviorError`. These tests pin that, so an SDK release that changes it is noticed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents.exceptions import ModelBehaviorError
from agents.run_state import RunState
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

ORIGINAL = {"order_id": 1, "amount": 80}
EDITED = {"order_id": 1, "amount": 50}


def build(ran: list[tuple[int, float]]) -> Agent[Any]:
    @function_tool(needs_approval=True)
    def refund(order_id: int, amount: float) -> str:
        ran.append((order_id, amount))
        return f"refunded {amount} for {order_id}"

    return Agent(
        name="a",
        tools=[refund],
        model=ScriptedModel(
            [
                ModelStep(output=[function_call("refund", ORIGINAL, call_id="c1")]),
                ModelStep(output=[assistant_message("done")]),
            ]
        ),
    )


async def paused(agent: Agent[Any]) -> str:
    result = Runner.run_streamed(agent, "refund")
    async for _ in result.stream_events():
        pass
    assert [item.call_id for item in result.interruptions] == ["c1"]
    return result.to_state().to_string()


async def finish(agent: Agent[Any], state: RunState[Any, Any]) -> None:
    result = Runner.run_streamed(agent, state)
    async for _ in result.stream_events():
        pass


async def test_the_call_as_requested_runs_once_approved() -> None:
    ran: list[tuple[int, float]] = []
    agent = build(ran)
    state = await RunState.from_string(agent, await paused(agent))
    [item] = state.get_interruptions()
    state.approve(item)
    await finish(agent, state)
    assert ran == [(1, 80.0)]


async def test_approving_a_call_whose_arguments_were_edited_is_refused() -> None:
    ran: list[tuple[int, float]] = []
    agent = build(ran)
    state = await RunState.from_string(agent, await paused(agent))
    [item] = state.get_interruptions()
    item.raw_item.arguments = json.dumps(EDITED)  # type: ignore[union-attr]
    with pytest.raises(ModelBehaviorError, match="reused a tool call ID"):
        state.approve(item)
    assert ran == []


async def test_editing_every_copy_in_the_checkpoint_is_refused_too() -> None:
    ran: list[tuple[int, float]] = []
    agent = build(ran)
    saved = await paused(agent)
    data = json.loads(saved)
    copies = 0

    def edit(node: Any) -> Any:
        nonlocal copies
        if isinstance(node, dict):
            return {key: edit(value) for key, value in node.items()}
        if isinstance(node, list):
            return [edit(value) for value in node]
        if isinstance(node, str) and node.startswith("{") and '"amount"' in node:
            if json.loads(node) == ORIGINAL:
                copies += 1
                return json.dumps(EDITED)
        return node

    edited = await RunState.from_string(agent, json.dumps(edit(data)))
    # The call's arguments are kept in many places (the model response, the generated and
    # session items, the current step, the processed response); all were edited.
    assert copies >= 5
    [item] = edited.get_interruptions()
    assert json.loads(item.raw_item.arguments) == EDITED  # type: ignore[union-attr]
    with pytest.raises(ModelBehaviorError, match="reused a tool call ID"):
        edited.approve(item)
    assert ran == []
