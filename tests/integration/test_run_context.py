"""The run context a graph's tools read (docs/agents.md "Context"): built from the run's caller,
saved in every checkpoint in the graph's own type, rebuilt with `decided_by` after a decision,
and the same when another gateway recovers the run from its checkpoint."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunContextWrapper
from agents.testing import ModelStep, ScriptedModel

from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.agents.run_caller import RunCaller
from gateway.auth.access import TokenVerifier
from tests.support.agents import call, say
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, GatewayProcess, spawn_gateway
from tests.support.sqlite_file import sql

EMAIL = "olga@example.com"


@dataclass
class DeskContext:
    """A context type of the graph's own: the caller plus notes the tools keep adding to."""

    caller: RunCaller
    notes: list[str] = field(default_factory=list)


def desk_json(context: DeskContext) -> dict[str, Any]:
    return {"caller": context.caller.to_json(), "notes": list(context.notes)}


def desk_from(data: Mapping[str, Any], caller: RunCaller) -> DeskContext:
    return DeskContext(caller=caller, notes=list(data["notes"]))


def recording_tool(name: str, seen: list[dict[str, Any]], *, needs_approval: bool) -> FunctionTool:
    """Records what it reads from the context, and adds a note to it."""

    async def invoke(ctx: RunContextWrapper[Any], raw: str) -> str:
        context = ctx.context
        caller = context.caller if isinstance(context, DeskContext) else context
        assert isinstance(caller, RunCaller), type(context)
        notes = list(context.notes) if isinstance(context, DeskContext) else None
        seen.append({"tool": name, "caller": caller.to_json(), "notes": notes})
        if isinstance(context, DeskContext):
            context.notes.append(json.loads(raw or "{}").get("note", name))
        return f"{name} read the context"

    return FunctionTool(
        name=name,
        description=f"test tool {name}",
        params_json_schema={"type": "object", "properties": {}, "additionalProperties": True},
        on_invoke_tool=invoke,
        strict_json_schema=False,
        needs_approval=needs_approval,
    )


def desk_graph(steps: list[Any], seen: list[dict[str, Any]], *, typed: bool) -> AgentGraph:
    model = ScriptedModel(steps)

    def build() -> Agent[Any]:
        return Agent(
            name="desk",
            instructions="test agent",
            model=model,
            tools=[
                recording_tool("remember", seen, needs_approval=False),
                recording_tool("whoami", seen, needs_approval=True),
            ],
        )

    if not typed:
        return AgentGraph(
            name="desk", version="1", build=build, context_claims=frozenset({"email"})
        )
    return AgentGraph(
        name="desk",
        version="1",
        build=build,
        make_context=lambda caller: DeskContext(caller=caller),
        context_serializer=desk_json,
        context_deserializer=desk_from,
        context_claims=frozenset({"email"}),
    )


def checkpoint_contexts(db_path: Path, run_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(db_path) as db:
        rows = db.execute(
            "SELECT state FROM checkpoints WHERE run_id = ? ORDER BY version", (run_id,)
        ).fetchall()
    return [json.loads(state)["context"]["context"] for (state,) in rows]


async def approve(owner: Client, reviewer: Client, checkpoint_version: int) -> None:
    """Approve the call the run paused for at `checkpoint_version`."""
    requested = await owner.wait_event("approval.requested", checkpoint_version=checkpoint_version)
    approval_id = requested["data"]["approval_id"]
    await reviewer.request("approval.decide", approval_id=approval_id, decision="approve")


async def test_tools_read_the_caller_and_who_decided_through_a_custom_context(
    gateway_factory: Any, db_path: Path
) -> None:
    seen: list[dict[str, Any]] = []
    steps = [
        # `remember` runs before the pause and changes the context the checkpoint saves.
        ModelStep(output=[call("remember", "c1", note="first"), call("whoami", "c2")]),
        ModelStep(output=[call("remember", "c3", note="second"), call("whoami", "c4")]),
        ModelStep(output=[say("done")]),
    ]
    registry = AgentRegistry([desk_graph(steps, seen, typed=True)])
    async with gateway_factory(registry=registry) as gw:
        token = gw.verifier.issue("olga", "acme", ["user"], extra_claims={"email": EMAIL})
        owner = await Client.connect(gw.ws_url, token)
        rex = await Client.connect(gw.ws_url, gw.token("rex", "reviewer"))
        try:
            ack = await owner.request("run.start", input="who am I?")
            await approve(owner, rex, 1)
            await owner.wait_event("tool.output", call_id="c2")
            await owner.wait_event("run.paused")
            await owner.wait_event("run.paused", checkpoint_version=3)
        finally:
            await owner.close()
            await rex.close()
    run_id, thread_id = ack["run_id"], ack["thread_id"]
    expected = {
        "user": "olga",
        "tenant": "acme",
        "roles": ["user"],
        "claims": {"email": EMAIL},
        "thread_id": thread_id,
        "run_id": run_id,
        "agent": "desk",
    }
    remember, whoami = seen[0], seen[1]
    assert remember["caller"] == {**expected, "decided_by": None}
    # After the checkpoint round trip: the graph's type, its note, and who approved the call.
    assert whoami == {
        "tool": "whoami",
        "caller": {**expected, "decided_by": "rex"},
        "notes": ["first"],
    }
    assert checkpoint_contexts(db_path, run_id)[-1]["notes"] == ["first", "whoami", "second"]

    # The gateway died with the run under way from its newest checkpoint: another recovers it.
    sql(db_path, "UPDATE runs SET status = 'running' WHERE run_id = ?", (run_id,))
    async with gateway_factory(registry=registry) as gw:
        owner = await Client.connect(gw.ws_url, gw.token("olga", "user"))
        ann = await Client.connect(gw.ws_url, gw.token("ann", "reviewer"))
        try:
            await owner.request("thread.subscribe", thread_id=thread_id, after_seq=0)
            await owner.wait_event("run.recovered")
            # Recovered, the run asks again for the pending call; its checkpoint's context was
            # rebuilt from the run's row and approvals, not from this process's callers.
            await owner.wait_event("run.paused", checkpoint_version=4)
            recovered = checkpoint_contexts(db_path, run_id)[-1]
            assert recovered["caller"] == {**expected, "decided_by": "rex"}
            assert recovered["notes"] == ["first", "whoami", "second"]
            await approve(owner, ann, 4)
            await owner.wait_event("run.completed")
        finally:
            await owner.close()
            await ann.close()
    assert seen[-1] == {
        "tool": "whoami",
        "caller": {**expected, "decided_by": "ann"},
        "notes": ["first", "whoami", "second"],
    }


async def test_without_a_factory_the_context_is_the_caller(gateway_factory: Any) -> None:
    seen: list[dict[str, Any]] = []
    steps = [ModelStep(output=[call("whoami", "c1")]), ModelStep(output=[say("done")])]
    registry = AgentRegistry([desk_graph(steps, seen, typed=False)])
    async with gateway_factory(registry=registry) as gw:
        token = gw.verifier.issue(
            "olga", "acme", ["user"], extra_claims={"email": EMAIL, "salary": 1}
        )
        owner = await Client.connect(gw.ws_url, token)
        rex = await Client.connect(gw.ws_url, gw.token("rex", "reviewer"))
        try:
            ack = await owner.request("run.start", input="who am I?")
            await approve(owner, rex, 1)
            await owner.wait_event("run.completed")
        finally:
            await owner.close()
            await rex.close()
    # Only the claims the graph named reach the context.
    assert seen == [
        {
            "tool": "whoami",
            "caller": {
                "user": "olga",
                "tenant": "acme",
                "roles": ["user"],
                "claims": {"email": EMAIL},
                "thread_id": ack["thread_id"],
                "run_id": ack["run_id"],
                "agent": "desk",
                "decided_by": "rex",
            },
            "notes": None,
        }
    ]


async def test_a_run_started_from_queued_input_runs_for_its_senders_token(
    gateway_factory: Any,
) -> None:
    seen: list[dict[str, Any]] = []
    released = asyncio.Event()

    async def hold(ctx: RunContextWrapper[Any], raw: str) -> str:
        await released.wait()  # keeps the first run running while the input is queued
        return "held"

    steps = [
        ModelStep(output=[call("hold", "c1")]),
        ModelStep(output=[say("first done")]),
        ModelStep(output=[call("remember", "c2")]),
        ModelStep(output=[say("second done")]),
    ]
    graph = desk_graph(steps, seen, typed=False)
    build = graph.build

    def with_hold() -> Agent[Any]:
        agent = build()
        holding = FunctionTool(
            name="hold",
            description="test tool hold",
            params_json_schema={"type": "object", "properties": {}, "additionalProperties": True},
            on_invoke_tool=hold,
            strict_json_schema=False,
        )
        return agent.clone(tools=[*agent.tools, holding])

    registry = AgentRegistry([replace(graph, build=with_hold)])
    async with gateway_factory(registry=registry) as gw:
        owner = await Client.connect(gw.ws_url, gw.token("olga", "user"))
        # The same user on another device, with a token that has more to say.
        token = gw.verifier.issue(
            "olga", "acme", ["user", "reviewer"], extra_claims={"email": EMAIL}
        )
        phone = await Client.connect(gw.ws_url, token)
        try:
            ack = await owner.request("run.start", input="first")
            await owner.wait_event("tool.called")
            queued = await phone.request("run.input", thread_id=ack["thread_id"], input="second")
            assert queued["disposition"] == "queued"
            released.set()
            await owner.wait_event("run.completed", final_output="second done")
        finally:
            await owner.close()
            await phone.close()
    [remember] = seen
    caller = remember["caller"]
    # The roles and claims of the token that sent the input, not of the one that started the
    # first run.
    assert (caller["user"], caller["roles"], caller["claims"]) == (
        "olga",
        ["reviewer", "user"],
        {"email": EMAIL},
    )
    assert caller["run_id"] != ack["run_id"]


@pytest.mark.both_backends
async def test_a_run_paused_on_a_killed_process_sees_its_caller_on_the_next(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    """kill -9 of the process a run paused on; a reviewer decides on another process, which
    continues the run from its checkpoint: the tool sees the run's caller and who decided."""
    caller_file = tmp_path / "callers.jsonl"
    env = {"GATEWAY_DATABASE_URL": database_url, "TEST_CALLER_FILE": str(caller_file)}
    args = ["--agents", "tests.support.agents:caller_registry"]
    first = spawn_gateway(tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-a"}, args=args)
    processes.append(first)
    verifier = TokenVerifier(TEST_SECRET)
    olga = await Client.connect(first.ws_url, verifier.issue("olga", "acme", ["user"]))
    try:
        ack = await olga.request("run.start", input="who am I?", agent="whoami")
        await olga.wait_event("run.paused")
    finally:
        await olga.close()
    first.kill()

    second = spawn_gateway(tmp_path, env={**env, "GATEWAY_INSTANCE_ID": "gw-b"}, args=args)
    processes.append(second)
    rex = await Client.connect(second.ws_url, verifier.issue("rex", "acme", ["reviewer"]))
    try:
        await rex.request("inbox.subscribe")
        inbox = await rex.wait_for(lambda frame: frame.get("type") == "inbox")
        [pending] = inbox["approvals"]
        await rex.request("approval.decide", approval_id=pending["approval_id"], decision="approve")
        await rex.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
        await rex.wait_event("run.completed")
    finally:
        await rex.close()
    [seen] = [json.loads(line) for line in caller_file.read_text().splitlines()]
    assert seen == {
        "user": "olga",
        "tenant": "acme",
        "roles": ["user"],
        "claims": {},
        "thread_id": ack["thread_id"],
        "run_id": ack["run_id"],
        "agent": "whoami",
        "decided_by": "rex",
    }
