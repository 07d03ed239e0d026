"""Pause for approval, decide, continue: with the offline demo agent (docs/protocol.md §9)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.agents.demo.assistant import email_text, refund_text
from tests.support.client import ProtocolFailure, final_text

pytestmark = pytest.mark.both_backends


async def start(client, text: str) -> tuple[str, str]:
    ack = await client.request("run.start", input=text)
    return ack["thread_id"], ack["run_id"]


async def test_approve_path_completes_with_tool_output(connect) -> None:
    alice = await connect("alice", "user")
    bob = await connect("bob", "reviewer")
    thread_id, run_id = await start(alice, "refund order 42 for 30 dollars")

    requested = await alice.wait_event("approval.requested")
    paused = await alice.wait_event("run.paused")
    assert requested["data"]["tool_name"] == "issue_refund"
    assert requested["data"]["arguments"] == {"order_id": 42, "amount": 30.0}
    assert paused["data"] == {"reason": "approval", "checkpoint_version": 1}
    assert requested["seq"] < paused["seq"]

    ack = await bob.request(
        "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
    )
    assert ack["approval"]["status"] == "approved"
    assert ack["approval"]["reviewer"] == "bob"

    await alice.wait_event("run.completed")
    events = alice.events_of(thread_id)
    names = [e["event"] for e in events]
    decided = names.index("approval.decided")
    assert names[decided + 1] == "run.resumed"
    assert "tool.output" in names[decided:]
    assert refund_text(42, 30.0) in final_text(events, run_id)
    # Dense, ordered, no repeats.
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


async def test_reject_reason_reaches_model_verbatim(connect) -> None:
    alice = await connect("alice", "user")
    bob = await connect("bob", "reviewer")
    thread_id, run_id = await start(alice, "please refund order 7")
    requested = await alice.wait_event("approval.requested")
    reason = "Refunds over policy need a manager — ticket #88 (not approved)."
    await bob.request(
        "approval.decide",
        approval_id=requested["data"]["approval_id"],
        decision="reject",
        reason=reason,
    )
    await alice.wait_event("run.completed")
    events = alice.events_of(thread_id)
    output = next(e for e in events if e["event"] == "tool.output")
    assert output["data"]["output"] == reason
    assert reason in final_text(events, run_id)
    decided = next(e for e in events if e["event"] == "approval.decided")
    assert decided["data"]["reason"] == reason
    assert decided["data"]["decision"] == "reject"


async def test_two_calls_in_one_response_wait_for_both_decisions(connect) -> None:
    alice = await connect("alice", "user")
    bob = await connect("bob", "reviewer")
    thread_id, run_id = await start(alice, "refund order 5 for 12 and email ann@example.com")
    await alice.wait_event("run.paused")
    requested = [e for e in alice.events_of(thread_id) if e["event"] == "approval.requested"]
    assert [e["data"]["tool_name"] for e in requested] == ["issue_refund", "send_email"]
    assert len({e["data"]["checkpoint_version"] for e in requested}) == 1

    await bob.request(
        "approval.decide", approval_id=requested[0]["data"]["approval_id"], decision="approve"
    )
    await alice.wait_event("approval.decided", approval_id=requested[0]["data"]["approval_id"])
    await asyncio.sleep(0.3)
    assert not [e for e in alice.events_of(thread_id) if e["event"] == "run.resumed"]
    pong = await bob.request("ping")  # the connection stays healthy between decisions
    assert pong["type"] == "pong"

    await bob.request(
        "approval.decide",
        approval_id=requested[1]["data"]["approval_id"],
        decision="reject",
        reason="no emails today",
    )
    await alice.wait_event("run.completed")
    names = [e["event"] for e in alice.events_of(thread_id)]
    assert names.count("run.resumed") == 1
    final = final_text(alice.events_of(thread_id), run_id)
    assert refund_text(5, 12.0) in final
    assert "no emails today" in final
    assert email_text("ann@example.com", "") not in final


async def test_second_decision_on_same_approval_is_conflict(connect) -> None:
    alice = await connect("alice", "user")
    bob = await connect("bob", "reviewer")
    carol = await connect("carol", "admin")
    await start(alice, "refund order 1 for 2")
    requested = await alice.wait_event("approval.requested")
    approval_id = requested["data"]["approval_id"]
    await bob.request("approval.decide", approval_id=approval_id, decision="approve")
    with pytest.raises(ProtocolFailure) as failure:
        await carol.request("approval.decide", approval_id=approval_id, decision="reject")
    assert failure.value.code == "conflict"
    await alice.wait_event("run.completed")
    decided = [e for e in alice.events if e["event"] == "approval.decided"]
    assert len(decided) == 1 and decided[0]["data"]["reviewer"] == "bob"


async def test_input_while_paused_is_staged_and_lands_in_same_run(connect) -> None:
    alice = await connect("alice", "user")
    bob = await connect("bob", "reviewer")
    thread_id, run_id = await start(alice, "refund order 3 for 4")
    requested = await alice.wait_event("approval.requested")
    ack = await alice.request("run.input", thread_id=thread_id, input="also say thanks")
    assert ack["disposition"] == "staged"
    assert ack["run_id"] == run_id
    staged = await alice.wait_event("input.staged")
    assert staged["data"]["input"] == "also say thanks"
    await bob.request(
        "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
    )
    await alice.wait_event("run.completed")
    runs = {e["run_id"] for e in alice.events_of(thread_id)}
    assert runs == {run_id}
    # The staged input reached the model: the demo model quotes the newest user input.
    assert "also say thanks" in final_text(alice.events_of(thread_id), run_id)


async def test_input_staged_on_a_run_then_cancelled_is_dropped(connect) -> None:
    """Staged input was for the paused run's continuation: cancelled, the run never takes it,
    no run answers it, and it no longer counts as waiting on the thread."""
    alice = await connect("alice", "user")
    thread_id, run_id = await start(alice, "refund order 3 for 4")
    await alice.wait_event("run.paused")
    ack = await alice.request("run.input", thread_id=thread_id, input="also say thanks")
    assert ack["disposition"] == "staged"
    await alice.request("run.cancel", run_id=run_id)
    await alice.wait_event("run.cancelled")
    await asyncio.sleep(0.3)
    assert {e["run_id"] for e in alice.events_of(thread_id)} == {run_id}
    # The thread is idle: the next input starts a run of its own, answering that input alone.
    after = await alice.request("run.input", thread_id=thread_id, input="hello again")
    assert after["disposition"] == "started"
    await alice.wait_for(
        lambda f: f.get("event") == "run.completed" and f["run_id"] == after["run_id"], 30
    )
    answer = final_text(alice.events_of(thread_id), after["run_id"])
    assert "hello again" in answer and "also say thanks" not in answer


async def test_input_while_running_is_queued_then_becomes_next_run(connect, gateway) -> None:
    alice = await connect("alice", "user")
    thread_id, first_run = await start(alice, "tell me a story about rivers")
    ack = await alice.request("run.input", thread_id=thread_id, input="and one about hills")
    assert ack["disposition"] == "queued"
    await alice.wait_event("input.queued")
    started = await alice.wait_for(
        lambda f: f.get("event") == "run.started" and f["run_id"] != first_run, timeout=30
    )
    assert started["data"]["input"] == "and one about hills"
    await alice.wait_for(
        lambda f: f.get("event") == "run.completed" and f["run_id"] == started["run_id"], 30
    )


async def test_run_start_on_busy_thread_is_conflict(connect) -> None:
    alice = await connect("alice", "user")
    thread_id, _ = await start(alice, "refund order 9")
    await alice.wait_event("run.paused")
    with pytest.raises(ProtocolFailure) as failure:
        await alice.request("run.start", thread_id=thread_id, input="hello")
    assert failure.value.code == "conflict"


async def test_cancel_paused_run_supersedes_its_approval(connect) -> None:
    alice = await connect("alice", "user")
    bob = await connect("bob", "reviewer")
    _, run_id = await start(alice, "refund order 11")
    requested = await alice.wait_event("approval.requested")
    await alice.request("run.cancel", run_id=run_id)
    await alice.wait_event("run.cancelled")
    with pytest.raises(ProtocolFailure) as failure:
        await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
    assert failure.value.code == "conflict"
    with pytest.raises(ProtocolFailure) as again:
        await alice.request("run.cancel", run_id=run_id)
    assert again.value.code == "conflict"


async def test_cancel_streaming_run_aborts_open_message(gateway_factory) -> None:
    from tests.support.client import Client

    async with gateway_factory(demo_delay_ms=20) as gw:
        alice = await Client.connect(gw.ws_url, gw.token("alice"))
        ack = await alice.request("run.start", input="tell me a story")
        await alice.wait_event("message.delta")
        await alice.request("run.cancel", run_id=ack["run_id"])
        await alice.wait_event("run.cancelled")
        names = [e["event"] for e in alice.events]
        assert "message.aborted" in names
        assert "message.completed" not in names
        assert names.index("message.aborted") < names.index("run.cancelled")
        await alice.close()
