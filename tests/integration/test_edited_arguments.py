"""Approve with edits (docs/protocol.md §4 `approval.decide`, `arguments`): for a tool its graph
lets reviewers edit, a reviewer approves a call with other arguments, checked against the tool's
schema; the tool runs with them, the model reads that they changed, and the log and the audit
trail keep both the call as made and the edit."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from agents.testing import ModelStep

from gateway.agents.edited_arguments import edit_note
from gateway.agents.registry import AgentRegistry
from tests.support.agents import EffectLog, call, say, scripted_graph
from tests.support.client import Client, ProtocolFailure


def editable_graph(effects: EffectLog) -> tuple[AgentRegistry, Any]:
    graph, model = scripted_graph(
        "biller",
        [
            ModelStep(output=[call("charge", "call_c", value="30")]),
            ModelStep(output=[say("charged")]),
            ModelStep(output=[call("refund", "call_r", value="5")]),
            ModelStep(output=[say("refunded")]),
        ],
        effects,
        tools=(("charge", True), ("refund", True)),
    )
    graph = dataclasses.replace(graph, editable_arguments=frozenset({"charge"}))
    return AgentRegistry([graph]), model


def outputs_of(model_input: Any) -> list[str]:
    return [str(i["output"]) for i in model_input if i.get("type") == "function_call_output"]


async def refused(client: Client, **frame: Any) -> str:
    with pytest.raises(ProtocolFailure) as failure:
        await client.request("approval.decide", **frame)
    return str(failure.value.code)


async def test_a_reviewer_approves_a_call_with_edited_arguments(
    gateway_factory: Callable[..., Any],
) -> None:
    effects = EffectLog()
    registry, model = editable_graph(effects)
    async with gateway_factory(registry=registry) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        bob = await Client.connect(gw.ws_url, gw.token("bob", "reviewer"))
        try:
            started = await alice.request("run.start", input="charge me")
            requested = await alice.wait_event("approval.requested")
            approval_id = requested["data"]["approval_id"]
            # Refused, recording nothing: a value the schema does not take, an edited
            # rejection, something that is not an object.
            assert (
                await refused(
                    bob, approval_id=approval_id, decision="approve", arguments={"value": 5}
                )
                == "bad_request"
            )
            assert (
                await refused(
                    bob, approval_id=approval_id, decision="reject", arguments={"value": "20"}
                )
                == "bad_request"
            )
            ack = await bob.request(
                "approval.decide",
                approval_id=approval_id,
                decision="approve",
                arguments={"value": "20"},
            )
            assert ack["approval"]["edited_arguments"] == {"value": "20"}
            assert ack["approval"]["arguments"] == {"value": "30"}
            await alice.wait_event("run.completed", final_output="charged")
            # Another tool of the graph takes no edit.
            await alice.request("run.start", thread_id=started["thread_id"], input="refund")
            second = await alice.wait_event("approval.requested", tool_name="refund")
            assert (
                await refused(
                    bob,
                    approval_id=second["data"]["approval_id"],
                    decision="approve",
                    arguments={"value": "1"},
                )
                == "bad_request"
            )
            await bob.request(
                "approval.decide", approval_id=second["data"]["approval_id"], decision="approve"
            )
            await alice.wait_event("run.completed", final_output="refunded")
            events = alice.events_of(started["thread_id"])
            admin = {"Authorization": f"Bearer {gw.token('root', 'admin')}"}
            async with httpx.AsyncClient(base_url=gw.http_url, timeout=10) as http:
                trail = await http.get(
                    "/v1/audit", params={"action": "approval.decided"}, headers=admin
                )
        finally:
            await alice.close()
            await bob.close()
    # The tool ran once, with the edit; the other call as the model made it.
    assert effects.calls == [
        {"tool": "charge", "arguments": {"value": "20"}},
        {"tool": "refund", "arguments": {"value": "5"}},
    ]
    # The model reads what was really done.
    [charged] = outputs_of(model.calls[1].input)
    assert charged.startswith(edit_note('{"value":"20"}'))
    decided = [e["data"] for e in events if e["event"] == "approval.decided"]
    assert decided[0]["edited_arguments"] == {"value": "20"}
    assert "edited_arguments" not in decided[1]
    entries = {e["target"]: e["details"] for e in trail.json()["audit"]}
    first = entries[approval_id]
    assert first["edited_arguments_digest"] != first["arguments_digest"]
    assert "edited_arguments_digest" not in entries[second["data"]["approval_id"]]


async def test_an_edit_over_http(gateway_factory: Callable[..., Any]) -> None:
    effects = EffectLog()
    registry, _ = editable_graph(effects)
    async with gateway_factory(registry=registry) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
        try:
            await alice.request("run.start", input="charge me")
            requested = await alice.wait_event("approval.requested")
            path = f"/v1/approvals/{requested['data']['approval_id']}/decision"
            bob = {"Authorization": f"Bearer {gw.token('bob', 'reviewer')}"}
            async with httpx.AsyncClient(base_url=gw.http_url, timeout=10) as http:
                wrong = await http.post(
                    path, json={"decision": "approve", "arguments": ["x"]}, headers=bob
                )
                assert wrong.status_code == 400, wrong.text
                done = await http.post(
                    path, json={"decision": "approve", "arguments": {"value": "7"}}, headers=bob
                )
                assert done.status_code == 200, done.text
                assert done.json()["approval"]["edited_arguments"] == {"value": "7"}
            await alice.wait_event("run.completed", final_output="charged")
        finally:
            await alice.close()
    assert effects.calls == [{"tool": "charge", "arguments": {"value": "7"}}]
