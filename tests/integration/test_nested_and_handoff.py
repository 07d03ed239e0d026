"""Approvals in nested agents, after handoffs, several per response, and across graph versions."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from agents.testing import ModelStep

from gateway.agents.registry import AgentRegistry
from tests.support.agents import EffectLog, call, handoff_graph, nested_graph, say, scripted_graph
from tests.support.client import Client, ProtocolFailure, clients, final_text


def names(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in events]


def assert_dense(events: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


# -- nested agent used as a tool -----------------------------------------------------------


async def test_nested_agent_tool_approval_runs_inner_charge_once(gateway_factory) -> None:
    effects = EffectLog()
    graph, _, _ = nested_graph(effects)
    async with gateway_factory(registry=AgentRegistry([graph])) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        ack = await alice.request("run.start", input="please charge 5", agent="outer")
        thread_id, run_id = ack["thread_id"], ack["run_id"]

        paused = await alice.wait_event("run.paused")
        requested = [e for e in alice.events_of(thread_id) if e["event"] == "approval.requested"]
        assert len(requested) == 1
        assert requested[0]["data"]["tool_name"] == "charge"
        assert requested[0]["data"]["arguments"] == {"value": "5"}
        assert requested[0]["data"]["agent"] == "billing"
        assert requested[0]["seq"] < paused["seq"]
        assert effects.count("charge") == 0

        decided = await bob.request(
            "approval.decide", approval_id=requested[0]["data"]["approval_id"], decision="approve"
        )
        assert decided["approval"]["status"] == "approved"
        await alice.wait_event("run.completed")
        events = alice.events_of(thread_id)
        assert "outer done" in final_text(events, run_id)
        assert names(events).count("run.resumed") == 1
        assert names(events).count("approval.requested") == 1
        assert_dense(events)
        assert effects.count("charge") == 1


# -- handoff, then approval ------------------------------------------------------------------


async def test_approval_after_handoff_approve(gateway_factory) -> None:
    effects = EffectLog()
    graph, _, _ = handoff_graph(effects)
    async with gateway_factory(registry=AgentRegistry([graph])) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        ack = await alice.request("run.start", input="I want a refund")
        thread_id, run_id = ack["thread_id"], ack["run_id"]

        changed = await alice.wait_event("agent.changed")
        assert changed["data"]["agent"] == "refunds"
        requested = await alice.wait_event("approval.requested")
        await alice.wait_event("run.paused")
        assert requested["data"]["agent"] == "refunds"
        assert requested["data"]["tool_name"] == "charge"
        assert requested["data"]["arguments"] == {"value": "7"}
        assert changed["seq"] < requested["seq"]

        await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed")
        events = alice.events_of(thread_id)
        assert "refunds finished" in final_text(events, run_id)
        # Said once: the continuation goes on with the agent the pause was in.
        assert names(events).count("agent.changed") == 1
        outputs = [e for e in events if e["event"] == "tool.output"]
        assert [o["data"]["call_id"] for o in outputs if o["data"]["tool_name"] == "charge"] == [
            "call_r1"
        ]
        assert_dense(events)
        assert effects.count("charge") == 1


async def test_approval_after_handoff_reject_with_reason(gateway_factory) -> None:
    effects = EffectLog()
    graph, _, _ = handoff_graph(effects)
    reason = "Refund denied: order is older than 90 days (policy R-12)."
    async with gateway_factory(registry=AgentRegistry([graph])) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        ack = await alice.request("run.start", input="I want a refund")
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        await alice.wait_event("agent.changed", agent="refunds")
        requested = await alice.wait_event("approval.requested", agent="refunds")
        await bob.request(
            "approval.decide",
            approval_id=requested["data"]["approval_id"],
            decision="reject",
            reason=reason,
        )
        await alice.wait_event("run.completed")
        events = alice.events_of(thread_id)
        output = next(
            e for e in events if e["event"] == "tool.output" and e["data"]["call_id"] == "call_r1"
        )
        assert output["data"]["output"] == reason
        assert "refunds finished" in final_text(events, run_id)
        assert effects.count("charge") == 0


# -- two approval-gated calls in one model response ------------------------------------------


def two_call_graph(effects: EffectLog) -> Any:
    graph, _ = scripted_graph(
        "biller",
        [
            ModelStep(
                output=[
                    say("charging twice"),
                    call("charge", "call_a", value="a"),
                    call("charge", "call_b", value="b"),
                ]
            ),
            ModelStep(output=[say("both handled")]),
        ],
        effects,
    )
    return graph


async def _pause_with_two(alice: Client) -> tuple[str, str, list[dict[str, Any]]]:
    ack = await alice.request("run.start", input="charge a and b")
    thread_id, run_id = ack["thread_id"], ack["run_id"]
    await alice.wait_event("run.paused")
    requested = [e for e in alice.events_of(thread_id) if e["event"] == "approval.requested"]
    assert [e["data"]["call_id"] for e in requested] == ["call_a", "call_b"]
    assert [e["data"]["arguments"] for e in requested] == [{"value": "a"}, {"value": "b"}]
    assert len({e["data"]["checkpoint_version"] for e in requested}) == 1
    return thread_id, run_id, requested


async def test_two_calls_both_approved_one_continuation(gateway_factory) -> None:
    effects = EffectLog()
    registry = AgentRegistry([two_call_graph(effects)])
    async with gateway_factory(registry=registry) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        thread_id, run_id, requested = await _pause_with_two(alice)

        await bob.request(
            "approval.decide", approval_id=requested[0]["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("approval.decided", approval_id=requested[0]["data"]["approval_id"])
        assert "run.resumed" not in names(alice.events_of(thread_id))
        assert effects.count("charge") == 0

        await bob.request(
            "approval.decide", approval_id=requested[1]["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed")
        events = alice.events_of(thread_id)
        assert names(events).count("run.resumed") == 1
        assert names(events).count("run.paused") == 1
        assert "both handled" in final_text(events, run_id)
        assert effects.count("charge") == 2
        assert sorted(c["arguments"]["value"] for c in effects.calls) == ["a", "b"]
        assert_dense(events)


async def test_two_calls_approve_one_reject_other(gateway_factory) -> None:
    effects = EffectLog()
    registry = AgentRegistry([two_call_graph(effects)])
    async with gateway_factory(registry=registry) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        thread_id, run_id, requested = await _pause_with_two(alice)

        await bob.request(
            "approval.decide",
            approval_id=requested[0]["data"]["approval_id"],
            decision="reject",
            reason="not a",
        )
        await bob.request(
            "approval.decide", approval_id=requested[1]["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed")
        events = alice.events_of(thread_id)
        assert names(events).count("run.resumed") == 1
        outputs = {
            e["data"]["call_id"]: e["data"]["output"] for e in events if e["event"] == "tool.output"
        }
        assert outputs["call_a"] == "not a"
        assert "charge done" in outputs["call_b"]
        assert effects.count("charge") == 1
        assert effects.calls[0]["arguments"] == {"value": "b"}
        assert "both handled" in final_text(events, run_id)


# -- agent graph version mismatch across restarts --------------------------------------------


async def test_graph_version_mismatch_refuses_then_compatible_version_accepts(
    gateway_factory,
) -> None:
    effects = EffectLog()
    v1, _ = scripted_graph(
        "versioned",
        [ModelStep(output=[call("charge", "call_v", value="9")])],
        effects,
        version="1",
    )
    async with gateway_factory(registry=AgentRegistry([v1])) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        ack = await alice.request("run.start", input="charge 9")
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        requested = await alice.wait_event("approval.requested")
        await alice.wait_event("run.paused")
        approval_id = requested["data"]["approval_id"]
        first_seen = alice.events_of(thread_id)

    # Version 2 of the same graph name, not declared compatible with version 1.
    v2, _ = scripted_graph(
        "versioned", [ModelStep(output=[say("never used")])], effects, version="2"
    )
    async with gateway_factory(registry=AgentRegistry([v2])) as gw, clients(gw) as connect:
        bob = await connect("bob", "reviewer")
        with pytest.raises(ProtocolFailure) as failure:
            await bob.request("approval.decide", approval_id=approval_id, decision="approve")
        assert failure.value.code == "graph_mismatch"
        message = failure.value.frame["message"]
        assert "'1'" in message and "'2'" in message

        headers = {"Authorization": f"Bearer {gw.token('bob', 'reviewer')}"}
        async with gw.http() as http:
            response = await http.get(f"/v1/runs/{run_id}", headers=headers)
            assert response.status_code == 200
            run = response.json()["run"]
            assert run["status"] == "waiting_for_review"
            assert run["checkpoint_version"] == 1
            assert [a["approval_id"] for a in run["pending_approvals"]] == [approval_id]
            assert run["pending_approvals"][0]["status"] == "pending"
            pending = await http.get("/v1/approvals?status=pending", headers=headers)
            assert approval_id in [a["approval_id"] for a in pending.json()["approvals"]]
            log = await http.get(f"/v1/threads/{thread_id}/events", headers=headers)
            # Nothing was appended by the refused decision.
            assert log.json()["head_seq"] == first_seen[-1]["seq"]
        assert effects.count("charge") == 0

    # Version 2 again, now declaring it can restore version-1 checkpoints.
    v2_compatible, _ = scripted_graph(
        "versioned", [ModelStep(output=[say("v2 finished the charge")])], effects, version="2"
    )
    v2_compatible = dataclasses.replace(v2_compatible, compatible_versions=frozenset({"1"}))
    async with (
        gateway_factory(registry=AgentRegistry([v2_compatible])) as gw,
        clients(gw) as connect,
    ):
        bob = await connect("bob", "reviewer")
        await bob.request("thread.subscribe", thread_id=thread_id, after_seq=first_seen[-1]["seq"])
        ack = await bob.request("approval.decide", approval_id=approval_id, decision="approve")
        assert ack["approval"]["status"] == "approved"
        await bob.wait_event("run.completed")
        later = bob.events_of(thread_id)
        assert "v2 finished the charge" in final_text(later, run_id)
        all_events = first_seen + later
        assert_dense(all_events)
        assert effects.count("charge") == 1
