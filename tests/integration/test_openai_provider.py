"""The real OpenAI provider path (OPENAI_API_KEY, OPENAI_BASE_URL) against a fake Responses API.

No network: the gateway's `OpenAIProvider` talks to `tests.support.fake_openai`, which streams
Server-Sent Events in the shape the `openai` SDK parses. The run pauses for approval, resumes
from its checkpoint and completes exactly as with the offline model.
"""

from __future__ import annotations

import pytest
from agents.tracing.processors import default_exporter, default_processor

from gateway.agents.demo.assistant import refund_text
from tests.support.client import Client, final_text
from tests.support.fake_openai import running_fake_openai

MODEL = "gpt-test"
API_KEY = "sk-test"


async def test_refund_run_streams_pauses_and_completes_via_openai_provider(
    gateway_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_fake_openai() as (fake, port):
        base_url = f"http://127.0.0.1:{port}/v1"
        # Were tracing on, its exporter would post here (and be recorded) instead of to OpenAI.
        exporter = default_exporter()
        monkeypatch.setattr(exporter, "endpoint", f"{base_url}/traces/ingest")
        monkeypatch.setattr(exporter, "_api_key", API_KEY)
        async with gateway_factory(
            openai_api_key=API_KEY, openai_base_url=base_url, model=MODEL
        ) as gw:
            alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
            bob = await Client.connect(gw.ws_url, gw.token("bob", "reviewer"))
            try:
                ack = await alice.request("run.start", input="refund order 42 for 30 dollars")
                thread_id, run_id = ack["thread_id"], ack["run_id"]

                requested = await alice.wait_event("approval.requested")
                paused = await alice.wait_event("run.paused")
                assert requested["data"]["tool_name"] == "issue_refund"
                assert requested["data"]["arguments"] == {"order_id": 42, "amount": 30}
                assert paused["data"]["reason"] == "approval"
                assert len(fake.response_requests) == 1

                # The first response streamed word by word before the pause.
                before = alice.events_of(thread_id)
                names = [e["event"] for e in before]
                deltas = [e for e in before if e["event"] == "message.delta"]
                assert len(deltas) > 5
                assert names.index("message.started") < names.index("message.delta")
                assert names.index("message.completed") > max(
                    i for i, n in enumerate(names) if n == "message.delta"
                )
                first_text = next(e for e in before if e["event"] == "message.completed")
                assert "".join(e["data"]["delta"] for e in deltas) == first_text["data"]["text"]
                assert "refund 30 USD for order 42" in first_text["data"]["text"]

                decided = await bob.request(
                    "approval.decide",
                    approval_id=requested["data"]["approval_id"],
                    decision="approve",
                )
                assert decided["approval"]["status"] == "approved"
                await alice.wait_event("run.completed")

                events = alice.events_of(thread_id)
                assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
                output = next(e for e in events if e["event"] == "tool.output")
                assert output["data"]["output"] == refund_text(42, 30.0)
                assert refund_text(42, 30.0) in final_text(events, run_id)
                names = [e["event"] for e in events]
                assert names[names.index("approval.decided") + 1] == "run.resumed"
                assert names.count("message.completed") == 2
            finally:
                await alice.close()
                await bob.close()

        default_processor().force_flush()  # anything queued for export would go out now

    posts = fake.response_requests
    assert len(posts) == 2, [(r.method, r.path) for r in fake.requests]
    for post in posts:
        assert post.body["model"] == MODEL
        assert post.body["stream"] is True
        assert post.headers["authorization"] == f"Bearer {API_KEY}"
        assert "issue_refund" in {tool.get("name") for tool in post.body.get("tools", [])}
    # The resumed call carries the approved call and its output.
    second_input = posts[1].body["input"]
    outputs = [i for i in second_input if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == [refund_text(42, 30.0)]
    # Nothing but model calls: no tracing export, no other endpoint.
    assert [r.path for r in fake.requests] == ["/v1/responses", "/v1/responses"]
    assert not [r for r in fake.requests if "trac" in r.path]


async def test_chat_completions_on_a_keyless_compatible_server_with_a_prefixed_model(
    gateway_factory, caplog: pytest.LogCaptureFixture
) -> None:
    """GATEWAY_OPENAI_API=chat_completions against a server that needs no key, the model named
    with the multi-provider's `openai/` prefix: streaming, the tool call, the approval and the
    continuation, as over the Responses API."""
    caplog.set_level("INFO", logger="gateway")
    async with running_fake_openai() as (fake, port):
        base_url = f"http://127.0.0.1:{port}/v1"
        async with gateway_factory(
            openai_api_key=None,
            openai_base_url=base_url,
            model=f"openai/{MODEL}",
            openai_api="chat_completions",
        ) as gw:
            alice = await Client.connect(gw.ws_url, gw.token("alice", "user"))
            bob = await Client.connect(gw.ws_url, gw.token("bob", "reviewer"))
            try:
                ack = await alice.request("run.start", input="refund order 7 for 12 dollars")
                requested = await alice.wait_event("approval.requested")
                assert requested["data"]["tool_name"] == "issue_refund"
                assert requested["data"]["arguments"] == {"order_id": 7, "amount": 12}
                await alice.wait_event("run.paused")
                deltas = [
                    e for e in alice.events_of(ack["thread_id"]) if e["event"] == "message.delta"
                ]
                assert len(deltas) > 5  # streamed word by word, not in one piece
                await bob.request(
                    "approval.decide",
                    approval_id=requested["data"]["approval_id"],
                    decision="approve",
                )
                await alice.wait_event("run.completed")
                events = alice.events_of(ack["thread_id"])
                assert refund_text(7, 12.0) in final_text(events, ack["run_id"])
            finally:
                await alice.close()
                await bob.close()

    posts = fake.chat_requests
    assert [r.path for r in fake.requests] == ["/v1/chat/completions"] * 2
    for post in posts:
        assert post.body["model"] == MODEL  # the prefix chose the provider and was dropped
        assert post.body["stream"] is True
        assert post.headers["authorization"] == "Bearer unused"
    tool_messages = [m for m in posts[1].body["messages"] if m.get("role") == "tool"]
    assert [m["content"] for m in tool_messages] == [refund_text(7, 12.0)]
    # The start-up log says which model the graph runs on, and through what.
    assert any(
        f"model openai/{MODEL}" in r.getMessage() and "chat_completions" in r.getMessage()
        for r in caplog.records
    )
