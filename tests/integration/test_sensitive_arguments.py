"""Sensitive tool arguments: masked for owners and viewers, in the stored log and in logs; real
for reviewers and admins (inbox, HTTP, and `approval.requested` over a subscription), and
always real for the tool itself."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from agents import Agent
from agents.testing import ModelStep, ScriptedModel

from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.auth.access import TokenVerifier
from gateway.run_lifecycle.sensitive_arguments import MASK
from tests.support.agents import (
    VAULT_CARD,
    EffectLog,
    call,
    effect_tool,
    nested_graph,
    say,
)
from tests.support.client import Client, ProtocolFailure, clients
from tests.support.gateway import TEST_SECRET, spawn_gateway

CARD = "4111-1111-1111-1111-sensitive"
SSN = "078-05-1120-sensitive"


def vault_graph(effects: EffectLog) -> AgentGraph:
    """`lookup` (every argument sensitive, no approval), then `charge` (its `card` sensitive,
    approval needed), then a final message. Outputs never repeat the arguments."""
    model = ScriptedModel(
        [
            ModelStep(output=[call("lookup", "call_l1", ssn=SSN, region="north")]),
            ModelStep(output=[say("charging"), call("charge", "call_c1", card=CARD, value="5")]),
            ModelStep(output=[say("all done")]),
        ]
    )

    def build() -> Agent[Any]:
        return Agent(
            name="vault",
            instructions="vault",
            model=model,
            tools=[
                effect_tool(effects, "lookup", needs_approval=False, output="found"),
                effect_tool(effects, "charge", needs_approval=True, output="charged"),
            ],
        )

    return AgentGraph(
        name="vault",
        version="1",
        build=build,
        sensitive_arguments={"charge": frozenset({"card"}), "lookup": frozenset({"*"})},
    )


def of_thread(client: Client, thread_id: str, name: str) -> list[dict[str, Any]]:
    return [e for e in client.events_of(thread_id) if e["event"] == name]


async def http_get(gw: Any, path: str, user: str, *roles: str) -> dict[str, Any]:
    async with gw.http() as http:
        response = await http.get(
            path, headers={"Authorization": f"Bearer {gw.token(user, *roles)}"}
        )
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_owner_and_viewer_see_masked_values_reviewers_see_real_ones(
    gateway_factory, db_path: Path
) -> None:
    effects = EffectLog()
    registry = AgentRegistry([vault_graph(effects)])
    async with gateway_factory(registry=registry) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        rita = await connect("rita", "reviewer")
        vera = await connect("vera", "viewer")
        await rita.request("inbox.subscribe")
        thread_id = (await alice.request("thread.create"))["thread_id"]
        # Watching before the run starts: the reviewer gets the approval on the live path.
        await rita.request("thread.subscribe", thread_id=thread_id)
        await vera.request("thread.subscribe", thread_id=thread_id)
        run_id = (await alice.request("run.start", thread_id=thread_id, input="pay"))["run_id"]
        for client in (alice, rita, vera):
            await client.wait_event("run.paused")

        masked_charge = {"card": MASK, "value": "5"}
        for client in (alice, vera):
            [requested] = of_thread(client, thread_id, "approval.requested")
            assert requested["data"]["arguments"] == masked_charge
            assert requested["data"]["masked"] == ["card"]
        [requested] = of_thread(rita, thread_id, "approval.requested")
        assert requested["data"]["arguments"] == {"card": CARD, "value": "5"}
        assert "masked" not in requested["data"]
        approval_id = requested["data"]["approval_id"]
        # "*" masks every argument; `tool.called` stays masked for everybody.
        for client in (alice, rita, vera):
            called = {
                e["data"]["tool_name"]: e["data"]
                for e in of_thread(client, thread_id, "tool.called")
            }
            assert called["lookup"]["arguments"] == {"region": MASK, "ssn": MASK}
            assert called["lookup"]["masked"] == ["region", "ssn"]
            assert called["charge"]["arguments"] == masked_charge
            [output] = of_thread(client, thread_id, "tool.output")
            assert output["data"]["output"] == "found"
        # The detour through the log for the reviewer kept the order: dense, no duplicates.
        seqs = [e["seq"] for e in rita.events_of(thread_id)]
        assert seqs == list(range(1, len(seqs) + 1))

        update = await rita.wait_for(lambda f: f.get("type") == "inbox.update" and f["added"])
        assert update["added"][0]["arguments"] == {"card": CARD, "value": "5"}

        # A reviewer (admin) subscribing afterwards gets it on the replay path.
        adam = await connect("adam", "admin")
        await adam.request("thread.subscribe", thread_id=thread_id)
        late = await adam.wait_event("approval.requested")
        assert late["data"]["arguments"] == {"card": CARD, "value": "5"}

        # HTTP: the inbox and run views follow the same rule.
        inbox = await http_get(gw, "/v1/approvals", "rita", "reviewer")
        assert inbox["approvals"][0]["arguments"] == {"card": CARD, "value": "5"}
        for user, role in (("alice", "user"), ("vera", "viewer")):
            run = (await http_get(gw, f"/v1/runs/{run_id}", user, role))["run"]
            [pending] = run["pending_approvals"]
            assert pending["arguments"] == masked_charge and pending["masked"] == ["card"]
        for user, role in (("rita", "reviewer"), ("adam", "admin")):
            run = (await http_get(gw, f"/v1/runs/{run_id}", user, role))["run"]
            assert run["pending_approvals"][0]["arguments"] == {"card": CARD, "value": "5"}
        # The stored log is served as stored: masked for everyone.
        body = await http_get(gw, f"/v1/threads/{thread_id}/events", "rita", "reviewer")
        assert CARD not in str(body) and SSN not in str(body)

        decided = await rita.request("approval.decide", approval_id=approval_id, decision="approve")
        assert decided["approval"]["arguments"] == {"card": CARD, "value": "5"}
        await alice.wait_event("run.completed")

    # The tools ran with the real values.
    assert effects.calls == [
        {"tool": "lookup", "arguments": {"ssn": SSN, "region": "north"}},
        {"tool": "charge", "arguments": {"card": CARD, "value": "5"}},
    ]
    with sqlite3.connect(db_path) as db:
        stored = [row[0] for row in db.execute("select data from events")]
        approvals = db.execute("select arguments, arguments_digest from approvals").fetchall()
    assert stored and not any(CARD in data or SSN in data for data in stored)
    # The approval row keeps the real arguments: reviewers decide on them.
    [(arguments, digest)] = approvals
    assert CARD in arguments and len(digest) == 64


async def test_self_approving_owner_gets_a_masked_ack(gateway_factory) -> None:
    registry = AgentRegistry([vault_graph(EffectLog())])
    async with (
        gateway_factory(registry=registry, self_approval=True) as gw,
        clients(gw) as connect,
    ):
        alice = await connect("alice", "user")
        await alice.request("run.start", input="pay")
        requested = await alice.wait_event("approval.requested")
        await alice.wait_event("run.paused")
        decided = await alice.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        assert decided["approval"]["arguments"] == {"card": MASK, "value": "5"}
        assert decided["approval"]["masked"] == ["card"]
        await alice.wait_event("run.completed")


async def test_nested_agent_tool_calls_are_masked(gateway_factory) -> None:
    effects = EffectLog()
    graph, _, _ = nested_graph(effects)
    graph = dataclasses.replace(
        graph,
        sensitive_arguments={"ask_billing": frozenset({"input"}), "charge": frozenset({"value"})},
    )
    async with gateway_factory(registry=AgentRegistry([graph])) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        ack = await alice.request("run.start", input="please charge 5", agent="outer")
        thread_id = ack["thread_id"]
        await alice.wait_event("run.paused")
        [called] = of_thread(alice, thread_id, "tool.called")
        assert called["data"]["tool_name"] == "ask_billing"
        assert called["data"]["arguments"] == {"input": MASK}
        [requested] = of_thread(alice, thread_id, "approval.requested")
        assert requested["data"]["agent"] == "billing"
        assert requested["data"]["arguments"] == {"value": MASK}

        await bob.request("thread.subscribe", thread_id=thread_id)
        revealed = await bob.wait_event("approval.requested")
        assert revealed["data"]["arguments"] == {"value": "5"}
        await bob.request(
            "approval.decide", approval_id=revealed["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed")
    assert effects.calls == [{"tool": "charge", "arguments": {"value": "5"}}]


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_tokens_secrets_and_sensitive_values_stay_out_of_the_logs(
    tmp_path: Path, log_format: str
) -> None:
    # At debug level: the most any deployment logs.
    gateway = spawn_gateway(
        tmp_path,
        env={"GATEWAY_LOG_LEVEL": "debug", "GATEWAY_LOG_FORMAT": log_format},
        args=["--agents", "tests.support.agents:sensitive_registry"],
    )
    verifier = TokenVerifier(TEST_SECRET)
    alice_token = verifier.issue("alice", "acme", ["user"])
    rita_token = verifier.issue("rita", "acme", ["reviewer"])
    now = int(time.time())
    expired = jwt.encode(
        {"sub": "alice", "tenant": "acme", "exp": now - 3600}, TEST_SECRET, algorithm="HS256"
    )
    forged = jwt.encode({"sub": "alice", "tenant": "acme", "exp": now + 3600}, "not-the-secret" * 4)
    ws_url = f"ws://127.0.0.1:{gateway.port}/v1/ws"
    try:
        for bad in (expired, forged, "garbage." + TEST_SECRET):
            try:
                await Client.connect(ws_url, bad)
            except ProtocolFailure as failure:
                assert failure.code == "unauthorized"
            else:
                raise AssertionError("a bad token was accepted")
        alice = await Client.connect(ws_url, alice_token)
        ack = await alice.request("run.start", input="charge my card", agent="vault")
        requested = await alice.wait_event("approval.requested")
        assert requested["data"]["arguments"]["card"] == MASK
        await alice.wait_event("run.paused")

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
            for bad in (expired, forged):
                response = await http.get("/v1/threads", headers={"Authorization": f"Bearer {bad}"})
                assert response.status_code == 401
                assert bad not in response.text and TEST_SECRET not in response.text
            decided = await http.post(
                f"/v1/approvals/{requested['data']['approval_id']}/decision",
                json={"decision": "approve"},
                headers={"Authorization": f"Bearer {rita_token}"},
            )
            assert decided.status_code == 200
            assert decided.json()["approval"]["arguments"]["card"] == VAULT_CARD
        completed = await alice.wait_event("run.completed")
        assert completed["run_id"] == ack["run_id"]
        await alice.close()
    finally:
        gateway.terminate()
    output = gateway.log()
    assert "gateway ready" in output  # the log was captured at all
    if log_format == "json":
        # Values inside JSON strings are escaped: compare what a log pipeline would read.
        # Every line is one JSON object (json.loads raises on any other).
        records = [json.loads(line) for line in output.splitlines() if line]
        output = "\n".join(str(value) for record in records for value in record.values())
    for needle in (TEST_SECRET, alice_token, rita_token, expired, forged, VAULT_CARD):
        assert needle not in output
