"""useChat on the gateway: the AI SDK's own `Chat` (@ai-sdk/react, as pinned in
tests/frontends/node) over its real HTTP and WebSocket transports against a real gateway
(docs/protocol.md §11)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from agents import Agent
from agents.testing import ModelStep, ScriptedModel
from openai.types.responses import ResponseOutputMessage, ResponseOutputRefusal

from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.frontends import conversation
from gateway.frontends.ai_sdk import responses
from gateway.frontends.ai_sdk.ui_chunks import RunChunks
from gateway.frontends.thread_log import LogEntry
from tests.integration.test_audit import db_rows_written
from tests.integration.test_audit import eventually as audit_eventually
from tests.integration.test_cross_process import TOKEN, bus_env, pair
from tests.support.agents import EffectLog, call, effect_tool, say, scripted_graph
from tests.support.approvals import http_decide
from tests.support.gateway import Gateway, GatewayProcess
from tests.support.node_scripts import node_or_skip, node_script

TRANSPORTS = ["http", "ws"]
REFUND = "refund order 42 for 30 dollars"
STORY = "tell me a story about a lighthouse"


def auth(
    gateway: Gateway, user: str = "alice", *roles: str, tenant: str = "acme"
) -> dict[str, str]:
    return {"Authorization": f"Bearer {gateway.token(user, *(roles or ('user',)), tenant=tenant)}"}


def config(
    gateway: Gateway, scenario: str, transport: str, chat_id: str, **extra: Any
) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "transport": transport,
        "base": gateway.http_url,
        "token": gateway.token("alice", "user"),
        "chatId": chat_id,
        **extra,
    }


async def run_chat(
    gateway: Gateway, scenario: str, transport: str, chat_id: str, **extra: Any
) -> dict[str, Any]:
    async with node_script(
        "ai_sdk_chat.mjs", config(gateway, scenario, transport, chat_id, **extra)
    ) as script:
        return await script.until("done", timeout_s=60)


def assistant(result: dict[str, Any]) -> dict[str, Any]:
    messages = [m for m in result["messages"] if m["role"] == "assistant"]
    assert len(messages) == 1, result["messages"]
    return messages[0]


def text_of(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in message["parts"] if p["type"] == "text")


def tool_part(message: dict[str, Any]) -> dict[str, Any]:
    parts = [p for p in message["parts"] if p["type"].startswith("tool-")]
    assert len(parts) == 1, message["parts"]
    return parts[0]


async def events_of(gateway: Gateway, thread_id: str) -> list[dict[str, Any]]:
    async with gateway.http() as http:
        answer = await http.get(f"/v1/threads/{thread_id}/events", headers=auth(gateway))
    assert answer.status_code == 200, answer.text
    return list(answer.json()["events"])


async def server_messages(
    gateway: Gateway, chat_id: str, user: str = "alice"
) -> list[dict[str, Any]]:
    async with gateway.http() as http:
        answer = await http.get(f"/v1/ai-sdk/chat/{chat_id}/messages", headers=auth(gateway, user))
    assert answer.status_code == 200, answer.text
    return list(answer.json()["messages"])


async def run_status(gateway: Gateway, run_id: str) -> str:
    async with gateway.http() as http:
        answer = await http.get(f"/v1/runs/{run_id}", headers=auth(gateway))
    assert answer.status_code == 200, answer.text
    return str(answer.json()["run"]["status"])


async def eventually_status(gateway: Gateway, run_id: str, wanted: str) -> None:
    for _ in range(400):
        if await run_status(gateway, run_id) == wanted:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} is {await run_status(gateway, run_id)}, not {wanted}")


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A message as both sides build it: the client may add fields of its own to a part."""
    keys = ("type", "text", "state", "toolCallId", "input", "output", "approval", "data")
    return {
        "id": message["id"],
        "role": message["role"],
        "parts": [{k: p[k] for k in keys if k in p} for p in message["parts"]],
    }


# -- streaming --------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_message_streams_into_one_assistant_message(
    gateway: Gateway, transport: str
) -> None:
    chat_id = f"chat-{transport}-hello"
    result = await run_chat(gateway, "stream", transport, chat_id, text="hello there")
    assert result["status"] == "ready" and result["error"] is None
    message = assistant(result)
    assert text_of(message) == 'You said: "hello there"'
    metadata = message["metadata"]
    assert metadata["threadId"] == chat_id and metadata["runId"] == message["id"]
    assert metadata["status"] == "completed"
    events = await events_of(gateway, chat_id)
    # The last chunk's seq is the run's last event: the app can correlate with the native API.
    assert metadata["seq"] == events[-1]["seq"] and events[-1]["event"] == "run.completed"
    # The chat is a thread of the caller's, listed like any other.
    async with gateway.http() as http:
        listed = (await http.get("/v1/threads", headers=auth(gateway))).json()["threads"]
    assert [t["owner"] for t in listed if t["thread_id"] == chat_id] == ["alice"]
    # The server's history is exactly what the client folded from the stream.
    history = await server_messages(gateway, chat_id)
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert history[0]["parts"] == [{"type": "text", "text": "hello there"}]
    assert comparable(history[1]) == comparable(message)
    assert history[1]["metadata"] == metadata


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_refusal_reaches_the_chat(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    """A refusal comes whole with the completed message, never as text deltas; the Agents SDK
    then fails the run (`ModelRefusalError`), and the chat shows the refusal and the error."""
    refusal = "I can't help with that."
    refused = ResponseOutputMessage(
        id="msg_refusal",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputRefusal(type="refusal", refusal=refusal)],
    )
    model = ScriptedModel([ModelStep(output=[refused])])

    def build() -> Agent[Any]:
        return Agent(name="refuser", instructions="test agent", model=model)

    registry = AgentRegistry([AgentGraph(name="refuser", version="1", build=build)])
    async with gateway_factory(registry=registry) as gateway:
        chat_id = f"chat-{transport}-refusal"
        result = await run_chat(gateway, "stream", transport, chat_id, text="do something bad")
        events = await events_of(gateway, chat_id)
        history = await server_messages(gateway, chat_id)
    assert [e["event"] for e in events if e["event"] == "message.delta"] == []
    assert result["status"] == "error", result
    assert result["error"].startswith("run_error: ModelRefusalError"), result
    message = assistant(result)
    assert text_of(message) == refusal
    assert comparable(history[1]) == comparable(message)


async def test_the_next_message_continues_the_same_chat(gateway: Gateway) -> None:
    first = await run_chat(gateway, "stream", "http", "chat-two-turns", text="one")
    second = await run_chat(
        gateway, "stream", "ws", "chat-two-turns", text="two", messages=first["messages"]
    )
    assert [text_of(m) for m in second["messages"] if m["role"] == "assistant"] == [
        'You said: "one"',
        'You said: "two"',
    ]
    history = await server_messages(gateway, "chat-two-turns")
    assert [comparable(m) for m in history if m["role"] == "assistant"] == [
        comparable(m) for m in second["messages"] if m["role"] == "assistant"
    ]


# -- approvals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_user_approves_inline_and_the_same_message_continues(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    async with gateway_factory(self_approval=True) as gateway:
        chat_id = f"chat-{transport}-approve"
        result = await run_chat(gateway, "approve", transport, chat_id, text=REFUND)
        assert result["status"] == "ready" and result["error"] is None, result
        message = assistant(result)
        part = tool_part(message)
        assert part["type"] == "tool-issue_refund"
        assert part["state"] == "output-available"
        assert part["output"].startswith("Refund of 30.00 USD issued for order 42")
        assert part["approval"]["approved"] is True
        assert part["approval"]["descriptor"]["canDecide"] is True
        # One message across the pause: the text before the call and the answer after it.
        assert "needs your approval" in text_of(message)
        assert message["metadata"]["status"] == "completed"
        sends = [
            r
            for r in result["wire"]["requests"]
            if r == "send" or (r.startswith("POST") and r.endswith(" /v1/ai-sdk/chat"))
        ]
        assert len(sends) == 2  # the message, then useChat's automatic follow-up
        events = await events_of(gateway, chat_id)
        decided = [e for e in events if e["event"] == "approval.decided"]
        assert [(d["data"]["decision"], d["data"]["reviewer"]) for d in decided] == [
            ("approve", "alice")
        ]
        history = await server_messages(gateway, chat_id)
        assert comparable(history[1]) == comparable(message)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_user_confirms_a_call_their_tool_leaves_to_them(
    gateway: Gateway, transport: str
) -> None:
    # Self-approval is off, but the demo agent's send_email is decided by "either"
    # (docs/protocol.md §3 "Who decides"): the response ends for the user to confirm it.
    chat_id = f"chat-{transport}-email"
    text = "email ann@example.com about order 3"
    result = await run_chat(gateway, "approve", transport, chat_id, text=text)
    assert result["status"] == "ready" and result["error"] is None, result
    part = tool_part(assistant(result))
    assert part["type"] == "tool-send_email"
    assert part["approval"]["descriptor"]["canDecide"] is True
    assert part["state"] == "output-available"
    assert part["output"].startswith("Email sent to ann@example.com")
    decided = [e for e in await events_of(gateway, chat_id) if e["event"] == "approval.decided"]
    assert [d["data"]["reviewer"] for d in decided] == ["alice"]


async def test_a_rejection_reaches_the_model_with_its_reason(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway:
        result = await run_chat(
            gateway,
            "approve",
            "http",
            "chat-reject",
            text=REFUND,
            approve=False,
            reason="not today",
        )
        part = tool_part(assistant(result))
        assert part["state"] == "output-denied"
        assert part["approval"] == {**part["approval"], "approved": False, "reason": "not today"}
        outputs = [
            e for e in await events_of(gateway, "chat-reject") if e["event"] == "tool.output"
        ]
        assert [o["data"]["output"] for o in outputs] == ["not today"]


def sse_chunks(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(block.removeprefix("data: "))
        for block in text.split("\n\n")
        if block.startswith("data: {")
    ]


async def test_answers_whose_run_pauses_again_at_once_get_the_next_pause(
    gateway_factory: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run resumes and pauses again before the answering request reads the log: the
    response still runs from the pause answered, to the next one."""
    graph, _ = scripted_graph(
        "twice",
        [
            ModelStep(output=[call("charge", "call_a")]),
            ModelStep(output=[call("charge", "call_b")]),
            ModelStep(output=[say("done")]),
        ],
        EffectLog(),
        tools=(("charge", True),),
    )
    decide_all = conversation.decide_all
    async with gateway_factory(AgentRegistry([graph]), self_approval=True) as gateway:
        services = gateway.app.state.services  # type: ignore[union-attr]

        async def decide_then_wait(*args: Any, thread_id: str, **kwargs: Any) -> None:
            await decide_all(*args, thread_id=thread_id, **kwargs)
            for _ in range(400):
                events = await services.log.read(thread_id, after_seq=0, limit=500)
                if [e.type for e in events].count("run.paused") == 2:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError("the run did not pause again")

        monkeypatch.setattr(conversation, "decide_all", decide_then_wait)
        async with gateway.http() as http:
            first = await http.post(
                "/v1/ai-sdk/chat", json=body("chat-twice", user("go")), headers=auth(gateway)
            )
            asked = next(c for c in sse_chunks(first.text) if c["type"] == "tool-approval-request")
            run_id = sse_chunks(first.text)[0]["messageId"]
            answer = {**answered(asked["approvalId"]), "id": run_id}
            second = await http.post(
                "/v1/ai-sdk/chat",
                json=body("chat-twice", answer, messageId=run_id),
                headers=auth(gateway),
                timeout=10,
            )
    chunks = sse_chunks(second.text)
    assert [c["approvalId"] for c in chunks if c["type"] == "tool-approval-response"] == [
        asked["approvalId"]
    ]
    requests = [c for c in chunks if c["type"] == "tool-approval-request"]
    assert [r["toolCallId"] for r in requests] == ["call_b"]
    assert chunks[-1]["type"] == "finish" and chunks[-1]["finishReason"] == "tool-calls"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_reviewer_decides_elsewhere_while_the_chat_waits(
    gateway: Gateway, transport: str
) -> None:
    chat_id = f"chat-{transport}-reviewer"
    async with node_script(
        "ai_sdk_chat.mjs", config(gateway, "reviewer", transport, chat_id, text=REFUND)
    ) as script:
        waiting = await script.until("approval")
        # The owner may not decide (self-approval is off): the response stays open.
        assert waiting["status"] == "streaming"
        assert waiting["descriptor"]["canDecide"] is False
        decided = await http_decide(
            gateway, gateway.token("bob", "reviewer"), waiting["approvalId"]
        )
        assert decided.status_code == 200, decided.text
        script.tell({"decided": True})
        result = await script.until("done", timeout_s=60)
    assert result["status"] == "ready" and result["error"] is None
    part = tool_part(assistant(result))
    assert part["state"] == "output-available" and part["approval"]["approved"] is True
    # No action from the user: the continuation came in the one response.
    assert len(result["wire"]["requests"]) == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_chat_dropped_while_a_reviewer_decides_rejoins_with_resume(
    gateway: Gateway, transport: str
) -> None:
    chat_id = f"chat-{transport}-reviewer-drop"
    async with node_script(
        "ai_sdk_chat.mjs",
        config(gateway, "reviewer", transport, chat_id, text=REFUND, dropWhileWaiting=True),
    ) as script:
        waiting = await script.until("approval")
        decided = await http_decide(
            gateway, gateway.token("bob", "reviewer"), waiting["approvalId"]
        )
        assert decided.status_code == 200, decided.text
        script.tell({"decided": True})
        result = await script.until("done", timeout_s=60)
    assert result["error"] is None, result
    message = assistant(result)
    assert tool_part(message)["state"] == "output-available"
    history = await server_messages(gateway, chat_id)
    assert comparable(history[1]) == comparable(message)


def mixed_pause() -> AgentRegistry:
    """A pause with a call its user confirms (`confirm`) beside one only a reviewer decides
    (`charge`)."""
    effects = EffectLog()

    def build() -> Agent[Any]:
        model = ScriptedModel(
            [
                ModelStep(output=[call("confirm", "call_c"), call("charge", "call_r")]),
                ModelStep(output=[say("both done")]),
            ]
        )
        tools = [effect_tool(effects, name, needs_approval=True) for name in ("confirm", "charge")]
        return Agent(name="mixed", instructions="test agent", model=model, tools=tools)

    graph = AgentGraph(
        name="mixed",
        version="1",
        build=build,
        decided_by={"confirm": "user", "charge": "reviewer"},
    )
    return AgentRegistry([graph])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_pause_mixing_the_users_call_and_a_reviewers_ends_for_the_user(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    async with gateway_factory(mixed_pause()) as gateway:
        chat_id = f"chat-{transport}-mixed"
        async with node_script(
            "ai_sdk_chat.mjs", config(gateway, "mixed", transport, chat_id, text="go")
        ) as script:
            paused = await script.until("paused")
            # The response ended (useChat sends answers only then), with both calls waiting.
            assert paused["status"] == "ready"
            assert paused["calls"] == [
                {"type": "tool-confirm", "state": "approval-requested", "canDecide": True},
                {"type": "tool-charge", "state": "approval-requested", "canDecide": False},
            ]
            answered = await script.until("answered")
            assert answered["status"] == "streaming"
            approval_id = next(
                e["data"]["approval_id"]
                for e in await events_of(gateway, chat_id)
                if e["event"] == "approval.requested" and e["data"]["tool_name"] == "charge"
            )
            decided = await http_decide(gateway, gateway.token("bob", "reviewer"), approval_id)
            assert decided.status_code == 200, decided.text
            script.tell({"decided": True})
            result = await script.until("done", timeout_s=60)
        events = await events_of(gateway, chat_id)
        history = await server_messages(gateway, chat_id)
    assert result["status"] == "ready" and result["error"] is None, result
    message = assistant(result)
    calls = [p for p in message["parts"] if p["type"].startswith("tool-")]
    assert [(p["type"], p["state"]) for p in calls] == [
        ("tool-confirm", "output-available"),
        ("tool-charge", "output-available"),
    ]
    assert text_of(message) == "both done"
    assert message["metadata"]["status"] == "completed"
    # The message, then the user's answer, whose response followed the run to its end.
    sends = [r for r in result["wire"]["requests"] if r == "send" or r.endswith(" /v1/ai-sdk/chat")]
    assert len(sends) == 2, result["wire"]
    tools = {
        e["data"]["approval_id"]: e["data"]["tool_name"]
        for e in events
        if e["event"] == "approval.requested"
    }
    decisions = [e["data"] for e in events if e["event"] == "approval.decided"]
    assert [(tools[d["approval_id"]], d["reviewer"]) for d in decisions] == [
        ("confirm", "alice"),
        ("charge", "bob"),
    ]
    assert comparable(history[1]) == comparable(message)


# -- resume, stop ---------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_drop_mid_stream_then_resume_gives_the_undisturbed_text(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    async with gateway_factory(demo_delay_ms=4) as gateway:
        undisturbed = await run_chat(
            gateway, "stream", transport, f"chat-{transport}-calm", text=STORY
        )
        chat_id = f"chat-{transport}-drop"
        async with node_script(
            "ai_sdk_chat.mjs",
            config(gateway, "dropResume", transport, chat_id, text=STORY, dropAfter=40),
        ) as script:
            dropped = await script.until("dropped")
            result = await script.until("done", timeout_s=60)
    assert dropped["partial"], "the drop came before any text"
    expected = text_of(assistant(undisturbed))
    assert len(expected.split()) >= 200
    partial = "".join(p.get("text", "") for p in dropped["partial"] if p["type"] == "text")
    assert 0 < len(partial) < len(expected)
    message = assistant(result)
    assert text_of(message) == expected
    assert [p["type"] for p in message["parts"]] == ["step-start", "text"]
    resumes = [r for r in result["wire"]["requests"] if r == "resume" or r.endswith("/stream")]
    assert len(resumes) == 1, result["wire"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_drop_just_before_the_end_loses_nothing(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    """The run ends while the client is away: within GATEWAY_AI_SDK_REPLAY_WINDOW_S a resume
    still replays the message to its end (the AI SDK's own servers answer 204 and leave the
    message cut)."""
    async with gateway_factory(demo_delay_ms=4) as gateway:
        undisturbed = await run_chat(
            gateway, "stream", transport, f"chat-{transport}-calm2", text=STORY
        )
        chat_id = f"chat-{transport}-late"
        async with node_script(
            "ai_sdk_chat.mjs",
            config(
                gateway,
                "dropResume",
                transport,
                chat_id,
                text=STORY,
                dropAfter=20,
                pauseBeforeResume=True,
            ),
        ) as script:
            await script.until("dropped")
            run_id = (await events_of(gateway, chat_id))[0]["run_id"]
            await eventually_status(gateway, run_id, "completed")
            script.tell({"resume": True})
            result = await script.until("done", timeout_s=60)
    assert text_of(assistant(result)) == text_of(assistant(undisturbed))
    assert assistant(result)["metadata"]["status"] == "completed"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_resume_with_nothing_active_changes_nothing(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    async with gateway_factory(ai_sdk_replay_window_s=0) as gateway:
        chat_id = f"chat-{transport}-idle"
        await run_chat(gateway, "stream", transport, chat_id, text="hi")
        result = await run_chat(gateway, "resumeIdle", transport, chat_id)
        assert result["messages"] == [] and result["status"] == "ready"
        # On the wire: 204 over HTTP, `no-active` on the socket, also for a chat never seen.
        async with gateway.http() as http:
            for chat in (chat_id, "never-seen"):
                answer = await http.get(f"/v1/ai-sdk/chat/{chat}/stream", headers=auth(gateway))
                assert answer.status_code == 204, answer.text
        async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/ai-sdk/ws") as socket:
            for chat in (chat_id, "never-seen"):
                frame = {
                    "type": "resume",
                    "requestId": chat,
                    "id": chat,
                    "headers": auth_header(gateway),
                    "body": {},
                }
                await socket.send(json.dumps(frame))
                assert json.loads(await socket.recv()) == {"type": "no-active", "requestId": chat}


async def test_a_finished_chat_past_the_window_has_nothing_active(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(ai_sdk_replay_window_s=0.5) as gateway, gateway.http() as http:
        await run_chat(gateway, "stream", "http", "chat-window", text="hi")
        within = await http.get("/v1/ai-sdk/chat/chat-window/stream", headers=auth(gateway))
        assert within.status_code == 200 and within.text.endswith("data: [DONE]\n\n")
        await asyncio.sleep(0.6)
        past = await http.get("/v1/ai-sdk/chat/chat-window/stream", headers=auth(gateway))
        assert past.status_code == 204


def auth_header(
    gateway: Gateway, user: str = "alice", *roles: str, tenant: str = "acme"
) -> dict[str, str]:
    return {"authorization": auth(gateway, user, *roles, tenant=tenant)["Authorization"]}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stop_cancels_the_run_and_keeps_the_text(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    async with gateway_factory(demo_delay_ms=4) as gateway:
        chat_id = f"chat-{transport}-stop"
        result = await run_chat(gateway, "stop", transport, chat_id, text=STORY, stopAfter=30)
        events = await events_of(gateway, chat_id)
        run_id = events[0]["run_id"]
        await eventually_status(gateway, run_id, "cancelled")
        history = await server_messages(gateway, chat_id)
    partial = "".join(p.get("text", "") for p in result["partial"] if p["type"] == "text")
    assert partial, "the stop came before any text"
    # The text streamed so far stays, in the client's message and in the server's history.
    kept = text_of(history[1])
    assert kept.startswith(partial)
    assert history[1]["metadata"]["status"] == "cancelled"
    assert [e["event"] for e in events][-1] == "run.cancelled"


async def test_a_closed_connection_never_stops_the_run(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(demo_delay_ms=2) as gateway:
        for transport in TRANSPORTS:
            chat_id = f"chat-{transport}-gone"
            async with node_script(
                "ai_sdk_chat.mjs", config(gateway, "stream", transport, chat_id, text=STORY)
            ):
                # Killed on leaving the block, once the story streams.
                events: list[dict[str, Any]] = []
                while len(events) < 10:
                    await asyncio.sleep(0.02)
                    async with gateway.http() as http:
                        answer = await http.get(
                            f"/v1/threads/{chat_id}/events", headers=auth(gateway)
                        )
                    events = answer.json().get("events", []) if answer.status_code == 200 else []
            run_id = events[0]["run_id"]
            assert await run_status(gateway, run_id) == "running"
            await eventually_status(gateway, run_id, "completed")


# -- bad input ----------------------------------------------------------------------------------


def body(chat_id: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": chat_id, "messages": list(messages), "trigger": "submit-message", **extra}


def user(text: Any) -> dict[str, Any]:
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


def answered(approval_id: str, approved: Any = True) -> dict[str, Any]:
    return {
        "id": "m1",
        "role": "assistant",
        "parts": [
            {
                "type": "tool-issue_refund",
                "toolCallId": "c1",
                "state": "approval-responded",
                "input": {},
                "approval": {"id": approval_id, "approved": approved},
            }
        ],
    }


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        ([], 400, "bad_request"),
        ({"messages": [user("x")]}, 400, "bad_request"),
        (body("bad id!", user("x")), 400, "bad_request"),
        (body("c"), 400, "bad_request"),
        (body("c", user("   ")), 400, "bad_request"),
        (body("c", user(5)), 400, "bad_request"),
        (body("c", user("x"), trigger="other"), 400, "bad_request"),
        (body("c", {"role": "system", "parts": []}), 400, "bad_request"),
        (body("c", answered("ap_x", approved="yes")), 400, "bad_request"),
        (body("c", user("x" * 40_000)), 413, "too_large"),
    ],
)
async def test_a_malformed_request_gets_a_coded_error_and_changes_nothing(
    gateway: Gateway, payload: Any, status: int, code: str
) -> None:
    async with gateway.http() as http:
        answer = await http.post("/v1/ai-sdk/chat", json=payload, headers=auth(gateway))
        assert answer.status_code == status, answer.text
        assert answer.json()["error"]["code"] == code
        listed = (await http.get("/v1/threads", headers=auth(gateway))).json()["threads"]
    assert listed == []


async def test_an_oversized_body_is_refused(gateway_factory: Callable[..., Any]) -> None:
    async with gateway_factory(frontend_body_bytes=65536) as gateway, gateway.http() as http:
        history = [user("x" * 1000) for _ in range(100)]
        answer = await http.post("/v1/ai-sdk/chat", json=body("c", *history), headers=auth(gateway))
        assert answer.status_code == 413
        assert answer.json()["error"]["code"] == "too_large"


async def test_another_users_chat_is_refused(gateway: Gateway) -> None:
    await run_chat(gateway, "stream", "http", "alices-chat", text="mine")
    before = await events_of(gateway, "alices-chat")
    async with gateway.http() as http:
        for who, status in (
            (auth(gateway, "mallory"), 403),
            (auth(gateway, "eve", tenant="other"), 404),
        ):
            sent = await http.post(
                "/v1/ai-sdk/chat", json=body("alices-chat", user("hi")), headers=who
            )
            assert sent.status_code == status, sent.text
            for path in ("stream", "messages"):
                read = await http.get(f"/v1/ai-sdk/chat/alices-chat/{path}", headers=who)
                assert read.status_code == status, read.text
            stopped = await http.post("/v1/ai-sdk/chat/alices-chat/stop", headers=who)
            assert stopped.status_code == status, stopped.text
    assert await events_of(gateway, "alices-chat") == before


async def test_refusals_on_the_socket_are_audited_as_over_http(
    gateway: Gateway, db_path: Path
) -> None:
    await run_chat(gateway, "stream", "http", "alices-audited", text="mine")
    mallory = auth_header(gateway, "mallory")
    async with websockets.connect(ws_url(gateway)) as socket:
        send = {
            "type": "send",
            "requestId": "s",
            "id": "alices-audited",
            "trigger": "submit-message",
            "messages": [user("hi")],
            "headers": mallory,
            "body": {},
        }
        for frame in (
            send,
            json.loads(resume_frame(gateway, "r", "alices-audited", **mallory)),
            {**send, "requestId": "f", "headers": {"authorization": "Bearer forged.x.y"}},
            {**send, "requestId": "m", "headers": {}},
        ):
            await socket.send(json.dumps(frame))
            error = json.loads(await socket.recv())
            assert error["type"] == "error" and error["requestId"] == frame["requestId"]
    denied = await audit_eventually(
        gateway, lambda entries: len(entries) >= 2, action="access.denied"
    )
    assert [
        (e["actor"], e["target"], e["details"]) for e in sorted(denied, key=lambda e: e["audit_id"])
    ] == [
        ("mallory", "alices-audited", {"code": "forbidden", "operation": op, "transport": "ws"})
        for op in ("ai-sdk.send", "ai-sdk.resume")
    ]
    rejected = await db_rows_written(db_path, "auth.token_rejected", 2)
    assert [json.loads(r["details"]) for r in rejected] == [
        {"transport": "ws", "reason": "invalid"},
        {"transport": "ws", "reason": "missing"},
    ]
    assert {r["source"] for r in rejected} == {"127.0.0.1"}


async def test_forged_and_decided_approval_ids_change_nothing(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway, gateway.http() as http:
        paused = await http.post(
            "/v1/ai-sdk/chat", json=body("chat-forge", user(REFUND)), headers=auth(gateway)
        )
        assert paused.status_code == 200
        approval_id = next(
            e["data"]["approval_id"]
            for e in await events_of(gateway, "chat-forge")
            if e["event"] == "approval.requested"
        )
        before = await events_of(gateway, "chat-forge")
        for forged, status in (("ap_forged", 404), ("x" * 65, 404)):
            answer = await http.post(
                "/v1/ai-sdk/chat", json=body("chat-forge", answered(forged)), headers=auth(gateway)
            )
            assert answer.status_code == status, answer.text
        # A real id next to a forged one: refused whole, the real one stays pending.
        both = answered(approval_id)
        both["parts"].append(
            {
                **both["parts"][0],
                "toolCallId": "c2",
                "approval": {"id": "ap_nope", "approved": True},
            }
        )
        answer = await http.post(
            "/v1/ai-sdk/chat", json=body("chat-forge", both), headers=auth(gateway)
        )
        assert answer.status_code == 404, answer.text
        # Another user's chat with a real approval id of this one: refused.
        other = await http.post(
            "/v1/ai-sdk/chat", json=body("chat-other", answered(approval_id)), headers=auth(gateway)
        )
        assert other.status_code == 404, other.text
        assert await events_of(gateway, "chat-forge") == before
        decided = await http.post(
            "/v1/ai-sdk/chat", json=body("chat-forge", answered(approval_id)), headers=auth(gateway)
        )
        assert decided.status_code == 200
        again = await http.post(
            "/v1/ai-sdk/chat", json=body("chat-forge", answered(approval_id)), headers=auth(gateway)
        )
        assert again.status_code == 409, again.text
        # Sent to another of the user's chats, paused too, the decided id is not found
        # there: nothing about it (decided, or whom it waits for) is told.
        mine = await http.post(
            "/v1/ai-sdk/chat", json=body("chat-mine", user(REFUND)), headers=auth(gateway)
        )
        assert mine.status_code == 200
        elsewhere = await http.post(
            "/v1/ai-sdk/chat", json=body("chat-mine", answered(approval_id)), headers=auth(gateway)
        )
        assert elsewhere.status_code == 404, elsewhere.text
        log = await events_of(gateway, "chat-forge")
    assert len([e for e in log if e["event"] == "approval.decided"]) == 1


async def test_the_socket_answers_bad_frames_per_request_and_stays_open(gateway: Gateway) -> None:
    node_or_skip()
    async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/ai-sdk/ws") as socket:
        # Nothing to address an answer to: ignored (the client would end the socket).
        await socket.send("not json")
        await socket.send(json.dumps({"type": "send"}))
        await socket.send(b"\x00binary")
        await socket.send(json.dumps({"type": "launch", "requestId": "a"}))
        assert json.loads(await socket.recv()) == {
            "type": "error",
            "requestId": "a",
            "errorText": "unknown request type 'launch'",
        }
        frame = {
            "type": "send",
            "requestId": "b",
            "id": "ws-bad",
            "headers": {},
            "body": {},
            "messages": [user("x")],
        }
        await socket.send(json.dumps(frame))
        error = json.loads(await socket.recv())
        assert error["requestId"] == "b" and error["errorText"].startswith("unauthorized")
        await socket.send(
            json.dumps({**frame, "requestId": "c", "headers": auth_header(gateway), "messages": []})
        )
        error = json.loads(await socket.recv())
        assert error["requestId"] == "c" and error["errorText"].startswith("bad_request")
        await socket.send(
            json.dumps(
                {
                    **frame,
                    "requestId": "d",
                    "headers": auth_header(gateway),
                    "messages": [user("x" * 40_000)],
                }
            )
        )
        error = json.loads(await socket.recv())
        assert error["requestId"] == "d" and error["errorText"].startswith("too_large")
        # The same socket still serves a good request.
        await socket.send(
            json.dumps(
                {**frame, "requestId": "e", "id": "ws-good", "headers": auth_header(gateway)}
            )
        )
        frames = []
        while not frames or frames[-1]["type"] != "end":
            frames.append(json.loads(await asyncio.wait_for(socket.recv(), 10)))
    good = [f for f in frames if f["requestId"] == "e"]
    assert [f["sequence"] for f in good if f["type"] == "chunk"] == list(range(len(good) - 1))
    assert good[0]["chunk"]["type"] == "start"
    assert [e["event"] for e in await events_of(gateway, "ws-good")][-1] == "run.completed"


def ws_url(gateway: Gateway) -> str:
    return f"ws://127.0.0.1:{gateway.port}/v1/ai-sdk/ws"


def resume_frame(gateway: Gateway, request_id: str, chat_id: str, **headers: str) -> str:
    return json.dumps(
        {
            "type": "resume",
            "requestId": request_id,
            "id": chat_id,
            "headers": headers or auth_header(gateway),
            "body": {},
        }
    )


async def test_a_socket_without_a_valid_token_is_closed_at_the_hello_timeout(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(hello_timeout_s=0.5) as gateway:
        async with (
            websockets.connect(ws_url(gateway)) as silent,
            websockets.connect(ws_url(gateway)) as forged,
            websockets.connect(ws_url(gateway)) as signed_in,
        ):
            await forged.send(resume_frame(gateway, "f", "c", authorization="Bearer forged.x.y"))
            assert json.loads(await forged.recv())["errorText"].startswith("unauthorized")
            await signed_in.send(resume_frame(gateway, "a", "never-seen"))
            assert json.loads(await signed_in.recv())["type"] == "no-active"
            for socket in (silent, forged):
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(socket.recv(), 5)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
            # A socket that has sent a valid token stays open past the timeout.
            await signed_in.send(resume_frame(gateway, "b", "never-seen"))
            assert json.loads(await signed_in.recv()) == {"type": "no-active", "requestId": "b"}


async def until_frame(socket: Any, kind: str) -> dict[str, Any]:
    """The next frame of type `kind` (a chunk's type for `chunk:<type>`)."""
    while True:
        frame = json.loads(await asyncio.wait_for(socket.recv(), 10))
        if frame["type"] == kind or f"chunk:{frame.get('chunk', {}).get('type')}" == kind:
            return dict(frame)


async def test_each_response_on_the_socket_holds_a_connection_slot(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(max_connections_per_user=2) as gateway, gateway.http() as http:
        chat_id = "chat-slots"
        # The replays are left unread: without a queue bound the client still sees its close.
        first = await websockets.connect(ws_url(gateway), max_queue=None)
        # A call only a reviewer decides: the response stays open through the pause.
        await first.send(
            json.dumps(
                {
                    "type": "send",
                    "requestId": "s",
                    "id": chat_id,
                    "trigger": "submit-message",
                    "messages": [user(REFUND)],
                    "headers": auth_header(gateway),
                    "body": {},
                }
            )
        )
        await until_frame(first, "chunk:tool-approval-request")
        await first.send(resume_frame(gateway, "r", chat_id))
        await until_frame(first, "start")
        # Two responses open: a third is refused on either transport, with the same error.
        async with websockets.connect(ws_url(gateway), max_queue=None) as second:
            await second.send(resume_frame(gateway, "x", chat_id))
            refused = json.loads(await second.recv())
            answer = await http.get(f"/v1/ai-sdk/chat/{chat_id}/stream", headers=auth(gateway))
            assert answer.status_code == 429, answer.text
            error = answer.json()["error"]
            assert refused == {
                "type": "error",
                "requestId": "x",
                "errorText": f"rate_limited: {error['message']}",
            }
            # The socket's responses end with it, and give their slots back.
            await first.close()
            for attempt in range(100):
                await second.send(resume_frame(gateway, f"y{attempt}", chat_id))
                if json.loads(await second.recv())["type"] == "start":
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the closed socket's slots were never released")


async def test_a_fault_on_the_socket_ends_the_request_with_an_internal_error(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    services = gateway.app.state.services  # type: ignore[union-attr]
    first_seq = services.runs.first_seq

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a fault in /srv/secret")

    async def cut(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise RuntimeError("a fault in /srv/secret")
        yield

    def send(request_id: str, chat_id: str) -> str:
        frame = {
            "type": "send",
            "requestId": request_id,
            "id": chat_id,
            "trigger": "submit-message",
            "messages": [user("hi")],
            "headers": auth_header(gateway),
            "body": {},
        }
        return json.dumps(frame)

    internal = "internal: internal error"
    async with websockets.connect(ws_url(gateway)) as socket:
        # Before the response streams.
        monkeypatch.setattr(services.runs, "first_seq", broken)
        await socket.send(send("a", "fault-before"))
        assert json.loads(await asyncio.wait_for(socket.recv(), 10)) == {
            "type": "error",
            "requestId": "a",
            "errorText": internal,
        }
        # Once it streams: its chunks so far, then the error.
        monkeypatch.setattr(services.runs, "first_seq", first_seq)
        monkeypatch.setattr(responses, "follow", cut)
        await socket.send(send("b", "fault-during"))
        frames = [json.loads(await asyncio.wait_for(socket.recv(), 10))]
        while frames[-1]["type"] == "chunk":
            frames.append(json.loads(await asyncio.wait_for(socket.recv(), 10)))
        assert frames[0]["chunk"]["type"] == "start"
        assert frames[-1] == {"type": "error", "requestId": "b", "errorText": internal}
        # The socket still serves the next request.
        monkeypatch.undo()
        await socket.send(resume_frame(gateway, "c", "never-seen"))
        assert json.loads(await socket.recv()) == {"type": "no-active", "requestId": "c"}
    failures = [r for r in caplog.records if r.getMessage().startswith("AI SDK socket: a send")]
    assert len(failures) == 2 and all(r.exc_info for r in failures)


async def test_a_foreign_origin_is_refused(gateway: Gateway) -> None:
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(
            f"ws://127.0.0.1:{gateway.port}/v1/ai-sdk/ws", origin="https://evil.example"
        ):
            pass
    assert refused.value.response.status_code == 403


async def test_the_stream_response_carries_the_ui_message_stream_header(gateway: Gateway) -> None:
    async with (
        gateway.http() as http,
        http.stream(
            "POST", "/v1/ai-sdk/chat", json=body("chat-headers", user("hi")), headers=auth(gateway)
        ) as answer,
    ):
        assert answer.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert answer.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([chunk async for chunk in answer.aiter_bytes()])
    frames = [line for line in raw.decode().split("\n\n") if line]
    assert frames[-1] == "data: [DONE]"
    assert json.loads(frames[0].removeprefix("data: "))["type"] == "start"


# -- across processes -----------------------------------------------------------------------------


def process_config(
    process: GatewayProcess, scenario: str, transport: str, chat_id: str, **extra: Any
) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "transport": transport,
        "base": f"http://127.0.0.1:{process.port}",
        "token": TOKEN.issue("alice", "acme", ["user"]),
        "chatId": chat_id,
        **extra,
    }


async def process_get(process: GatewayProcess, path: str, key: str) -> list[dict[str, Any]]:
    """`key` of what alice reads at `path` on `process`."""
    headers = {"Authorization": f"Bearer {TOKEN.issue('alice', 'acme', ['user'])}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{process.port}", timeout=10) as http:
        answer = await http.get(path, headers=headers)
    assert answer.status_code == 200, answer.text
    return list(answer.json()[key])


async def process_events(process: GatewayProcess, thread_id: str) -> list[dict[str, Any]]:
    return await process_get(process, f"/v1/threads/{thread_id}/events", "events")


async def server_messages_of(process: GatewayProcess, chat_id: str) -> list[dict[str, Any]]:
    return await process_get(process, f"/v1/ai-sdk/chat/{chat_id}/messages", "messages")


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_another_process_serves_the_resume(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess], transport: str
) -> None:
    """The run streams on one process; the client drops and resumes on another, which follows
    it over the Redis bus from the shared PostgreSQL log."""
    a, b = pair(tmp_path, database_url, processes, **bus_env("redis"), GATEWAY_DEMO_DELAY_MS="4")
    async with node_script(
        "ai_sdk_chat.mjs", process_config(a, "stream", transport, f"calm-{transport}", text=STORY)
    ) as script:
        undisturbed = await script.until("done", timeout_s=60)
    chat_id = f"moved-{transport}"
    config = process_config(
        a,
        "dropResume",
        transport,
        chat_id,
        text=STORY,
        dropAfter=40,
        resumeBase=f"http://127.0.0.1:{b.port}",
    )
    async with node_script("ai_sdk_chat.mjs", config) as script:
        await script.until("dropped")
        result = await script.until("done", timeout_s=60)
    assert text_of(assistant(result)) == text_of(assistant(undisturbed))
    assert assistant(result)["metadata"]["status"] == "completed"
    if transport == "ws":
        assert result["wire"]["sockets"] == 2
    else:
        hosts = [r.split(" ")[1] for r in result["wire"]["requests"]]
        assert hosts == [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
    # The run streamed on the first process all along.
    events = await process_events(b, chat_id)
    assert events[-1]["event"] == "run.completed"
    assert not [e for e in events if e["event"] == "run.recovered"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_run_taken_over_after_a_crash_resumes_with_the_undisturbed_text(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess], transport: str
) -> None:
    """SIGKILL of the process streaming the run: another process takes the run over once its
    lease expires and streams the cut turn again; the resumed message replaces the cut turn's
    partial text (`reset-step`), so it reads as an undisturbed run's."""
    a, b = pair(
        tmp_path,
        database_url,
        processes,
        **bus_env("redis"),
        GATEWAY_DEMO_DELAY_MS="8",
        GATEWAY_LEASE_TTL_S="2",
        GATEWAY_LEASE_SCAN_S="0.5",
    )
    async with node_script(
        "ai_sdk_chat.mjs", process_config(b, "stream", transport, f"calm-{transport}", text=STORY)
    ) as script:
        undisturbed = await script.until("done", timeout_s=60)
    chat_id = f"crash-{transport}"
    config = process_config(
        a,
        "dropResume",
        transport,
        chat_id,
        text=STORY,
        announceStreaming=30,
        pauseBeforeResume=True,
        resumeBase=f"http://127.0.0.1:{b.port}",
    )
    async with node_script("ai_sdk_chat.mjs", config) as script:
        await script.until("streaming")
        a.kill()
        dropped = await script.until("dropped")
        assert "".join(p.get("text", "") for p in dropped["partial"] if p["type"] == "text")
        for _ in range(600):
            events = await process_events(b, chat_id)
            if events[-1]["event"] == "run.completed":
                break
            await asyncio.sleep(0.05)
        assert [e["event"] for e in events if e["event"] == "run.recovered"] == ["run.recovered"]
        script.tell({"resume": True})
        result = await script.until("done", timeout_s=60)
    message = assistant(result)
    assert text_of(message) == text_of(assistant(undisturbed))
    assert [p["type"] for p in message["parts"]] == ["step-start", "text"]
    assert comparable((await server_messages_of(b, chat_id))[1]) == comparable(message)


def recovered_mid_reasoning(*, approved_before: bool) -> list[dict[str, Any]]:
    """The chunks of a run whose process stopped inside a reasoning summary, taken over by
    another process (`run.recovered`) that runs the cut turn again; `approved_before`: the cut
    step already held an approved call, which the checkpoint carries on, so the step is kept."""
    entries: list[tuple[str, dict[str, Any]]] = [("run.started", {"input": "q", "agent": "a"})]
    if approved_before:
        call = {"call_id": "c1", "tool_name": "lookup", "arguments": {}}
        entries += [
            ("tool.called", call),
            ("approval.requested", {**call, "approval_id": "ap_1", "reviewer_roles": []}),
            ("run.paused", {"reason": "approval", "checkpoint_version": 1}),
            ("approval.decided", {"approval_id": "ap_1", "decision": "approve"}),
            ("run.resumed", {"checkpoint_version": 1}),
        ]
    entries += [
        ("reasoning.started", {"reasoning_id": "rs_1"}),
        ("reasoning.delta", {"reasoning_id": "rs_1", "delta": "thinking"}),
        ("run.recovered", {"checkpoint_version": None}),
        ("reasoning.started", {"reasoning_id": "rs_2"}),
        ("reasoning.delta", {"reasoning_id": "rs_2", "delta": "thinking again"}),
        ("reasoning.completed", {"reasoning_id": "rs_2", "text": "thinking again"}),
        ("message.started", {"message_id": "m_2", "agent": "a"}),
        ("message.delta", {"message_id": "m_2", "delta": "answer"}),
        ("message.completed", {"message_id": "m_2", "text": "answer"}),
        ("run.completed", {"final_output": "answer"}),
    ]
    projection = RunChunks("t_1", "r_1", lambda tool: True)
    chunks = [projection.start(0)]
    for seq, (kind, data) in enumerate(entries, 1):
        step = projection.feed(LogEntry(seq, "r_1", kind, "2026-12-05T00:00:00.000Z", data))
        chunks += step.chunks + step.closing
    return chunks


@pytest.mark.parametrize("approved_before", [False, True])
async def test_a_run_recovered_mid_reasoning_folds_in_the_client(approved_before: bool) -> None:
    chunks = recovered_mid_reasoning(approved_before=approved_before)
    async with node_script("ai_sdk_fold.mjs", {"chunks": chunks}) as script:
        folded = await script.until("done")
    assert "error" not in folded, folded
    parts = [(p["type"], p.get("text"), p.get("state")) for p in folded["message"]["parts"]]
    # The cut reasoning goes with its step, or, in a step kept, ends where it was cut.
    kept = [("tool-lookup", None, "approval-responded"), ("reasoning", "thinking", "done")]
    assert parts == [
        ("step-start", None, None),
        *(kept if approved_before else []),
        ("reasoning", "thinking again", "done"),
        ("text", "answer", "done"),
    ]


async def test_a_frame_over_the_body_limit_closes_the_socket(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(frontend_body_bytes=65536) as gateway:
        async with websockets.connect(
            f"ws://127.0.0.1:{gateway.port}/v1/ai-sdk/ws", max_size=None
        ) as socket:
            await socket.send(json.dumps({"type": "send", "requestId": "a", "pad": "x" * 70_000}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(socket.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_stop_through_another_process_cancels_the_run_where_it_streams(
    tmp_path: Path, database_url: str, processes: list[GatewayProcess]
) -> None:
    a, b = pair(tmp_path, database_url, processes, **bus_env("redis"), GATEWAY_DEMO_DELAY_MS="8")
    headers = {"Authorization": f"Bearer {TOKEN.issue('alice', 'acme', ['user'])}"}
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.port}", timeout=20) as on_a,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.port}", timeout=20) as on_b,
        on_a.stream(
            "POST", "/v1/ai-sdk/chat", json=body("far", user(STORY)), headers=headers
        ) as streamed,
    ):
        lines = streamed.aiter_lines()
        deltas = 0
        while deltas < 10:
            deltas += '"text-delta"' in await anext(lines)
        stopped = await on_b.post("/v1/ai-sdk/chat/far/stop", headers=headers)
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["stopped"] is True
        rest = [line async for line in lines]
    chunks = [
        json.loads(line.removeprefix("data: ")) for line in rest if line.startswith("data: {")
    ]
    assert [c["type"] for c in chunks][-2:] == ["abort", "finish"]
    assert chunks[-1]["messageMetadata"]["status"] == "cancelled"
    assert [line for line in rest if line][-1] == "data: [DONE]"
    events = await process_events(a, "far")
    assert events[-1]["event"] == "run.cancelled"


# -- regenerate and edit ------------------------------------------------------------------------


def answering(*answers: str) -> tuple[AgentRegistry, ScriptedModel]:
    model = ScriptedModel([ModelStep(output=[say(answer)]) for answer in answers])

    def build() -> Agent[Any]:
        return Agent(name="answerer", instructions="test agent", model=model)

    return AgentRegistry([AgentGraph(name="answerer", version="1", build=build)]), model


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_regenerate_and_edit_replace_the_last_answer(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    registry, model = answering("first answer", "second answer", "third answer")
    async with gateway_factory(registry=registry) as gateway:
        chat_id = f"chat-{transport}-again"
        async with node_script(
            "ai_sdk_chat.mjs",
            config(
                gateway, "regenerate", transport, chat_id, text="question", edited="better question"
            ),
        ) as script:
            answered = await script.until("answered")
            regenerated = await script.until("regenerated")
            result = await script.until("done", timeout_s=60)
        events = await events_of(gateway, chat_id)
        history = await server_messages(gateway, chat_id)
    assert [text_of(m) for m in answered["messages"] if m["role"] == "assistant"] == [
        "first answer"
    ]
    assert [text_of(m) for m in regenerated["messages"] if m["role"] == "assistant"] == [
        "second answer"
    ]
    assert result["error"] is None
    assert [(m["role"], text_of(m)) for m in result["messages"]] == [
        ("user", "better question"),
        ("assistant", "third answer"),
    ]
    # The log keeps every answer; each later run says which it supersedes.
    starts = [e for e in events if e["event"] == "run.started"]
    assert [s["data"]["input"] for s in starts] == ["question", "question", "better question"]
    assert [s["data"].get("supersedes") for s in starts] == [
        None,
        starts[0]["run_id"],
        starts[1]["run_id"],
    ]
    # The agent's history follows the branch chosen: no earlier answer, no earlier question.
    assert [item.get("role") for item in model.calls[1].input] == ["user"]
    assert [item.get("content") for item in model.calls[2].input] == ["better question"]
    # useChat's history is the chosen branch.
    assert [comparable(m)["parts"] for m in history] == [
        comparable(m)["parts"] for m in result["messages"]
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_edit_of_an_earlier_message_is_refused_and_changes_nothing(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    """The gateway answers only the last input anew: an earlier turn's edit is 409, not a
    replacement of the last turn."""
    registry, _ = answering("first answer", "second answer", "never")
    async with gateway_factory(registry=registry) as gateway:
        chat_id = f"chat-{transport}-edit-earlier"
        async with node_script(
            "ai_sdk_chat.mjs",
            config(gateway, "editEarlier", transport, chat_id, texts=["one", "two"], edited="uno"),
        ) as script:
            answered = await script.until("answered")
            before = await events_of(gateway, chat_id)
            result = await script.until("done", timeout_s=60)
        after = await events_of(gateway, chat_id)
        history = await server_messages(gateway, chat_id)
    assert result["status"] == "error" and "conflict" in result["error"], result
    assert after == before
    assert [(m["role"], text_of(m)) for m in history] == [
        ("user", "one"),
        ("assistant", "first answer"),
        ("user", "two"),
        ("assistant", "second answer"),
    ]
    assert [comparable(m)["parts"] for m in history] == [
        comparable(m)["parts"] for m in answered["messages"]
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_regenerate_from_the_last_user_message_replaces_its_answer(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    registry, _ = answering("first answer", "second answer", "third answer", "fourth answer")
    async with gateway_factory(registry=registry) as gateway:
        chat_id = f"chat-{transport}-from-input"
        # The client's own id for the user message, then the gateway's (a hydrated history).
        fresh = await run_chat(
            gateway, "regenerateFromInput", transport, chat_id, texts=["one", "two"]
        )
        hydrated = await run_chat(
            gateway,
            "regenerateFromInput",
            transport,
            chat_id,
            texts=[],
            messages=await server_messages(gateway, chat_id),
        )
        events = await events_of(gateway, chat_id)
        history = await server_messages(gateway, chat_id)
    assert fresh["error"] is None and hydrated["error"] is None, (fresh, hydrated)
    assert not fresh["regeneratedFrom"].endswith("-input")
    assert hydrated["regeneratedFrom"].endswith("-input")
    assert [(m["role"], text_of(m)) for m in fresh["messages"]] == [
        ("user", "one"),
        ("assistant", "first answer"),
        ("user", "two"),
        ("assistant", "third answer"),
    ]
    expected = [
        ("user", "one"),
        ("assistant", "first answer"),
        ("user", "two"),
        ("assistant", "fourth answer"),
    ]
    assert [(m["role"], text_of(m)) for m in hydrated["messages"]] == expected
    assert [(m["role"], text_of(m)) for m in history] == expected
    starts = [e for e in events if e["event"] == "run.started"]
    assert [s["data"]["input"] for s in starts] == ["one", "two", "two", "two"]
    assert [s["data"].get("supersedes") for s in starts] == [
        None,
        None,
        starts[1]["run_id"],
        starts[2]["run_id"],
    ]


async def test_only_the_last_finished_answer_can_be_regenerated(gateway: Gateway) -> None:
    async with gateway.http() as http:
        never = body("chat-none", user("x"), trigger="regenerate-message")
        answer = await http.post("/v1/ai-sdk/chat", json=never, headers=auth(gateway))
        assert answer.status_code == 404, answer.text
        first = await http.post(
            "/v1/ai-sdk/chat", json=body("chat-once", user("one")), headers=auth(gateway)
        )
        assert first.status_code == 200
        old_run = (await events_of(gateway, "chat-once"))[0]["run_id"]
        await http.post(
            "/v1/ai-sdk/chat", json=body("chat-once", user("two")), headers=auth(gateway)
        )
        stale = body("chat-once", user("one"), trigger="regenerate-message", messageId=old_run)
        answer = await http.post("/v1/ai-sdk/chat", json=stale, headers=auth(gateway))
        assert answer.status_code == 409, answer.text
        edit = body("chat-once", user("uno"), messageId=f"{old_run}-input")
        answer = await http.post("/v1/ai-sdk/chat", json=edit, headers=auth(gateway))
        assert answer.status_code == 409, answer.text
    assert (
        len([e for e in await events_of(gateway, "chat-once") if e["event"] == "run.started"]) == 2
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_failed_run_ends_the_response_with_an_error(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    model = ScriptedModel([ModelStep.raise_error(RuntimeError("the provider fell over"))])

    def build() -> Agent[Any]:
        return Agent(name="fragile", instructions="test agent", model=model)

    registry = AgentRegistry([AgentGraph(name="fragile", version="1", build=build)])
    async with gateway_factory(registry=registry) as gateway:
        chat_id = f"chat-{transport}-fails"
        result = await run_chat(gateway, "stream", transport, chat_id, text="hi")
        events = await events_of(gateway, chat_id)
    # The AI SDK's one way to say a stream failed: an `error` chunk, never a silent end.
    assert result["status"] == "error"
    assert result["error"].startswith("run_error: RuntimeError")
    assert events[-1]["event"] == "run.failed"


async def test_a_retried_chat_shows_its_input_once_and_answers_it_anew(gateway: Gateway) -> None:
    """A failed run retried (POST /v1/runs/{id}/retry) answers the same input: the chat's
    history shows that input once, and a regenerate from it replaces the retried answer."""
    async with gateway.http() as http:
        failed = await http.post(
            "/v1/ai-sdk/chat", json=body("chat-flaky", user("flaky order 7")), headers=auth(gateway)
        )
        assert failed.status_code == 200
        [failed_id] = [
            e["run_id"]
            for e in await events_of(gateway, "chat-flaky")
            if e["event"] == "run.failed"
        ]
        retried = await http.post(f"/v1/runs/{failed_id}/retry", headers=auth(gateway))
        assert retried.status_code == 200, retried.text
        retry_id = retried.json()["run_id"]
        await eventually_status(gateway, retry_id, "completed")
        history = await server_messages(gateway, "chat-flaky")
        assert [m["role"] for m in history] == ["user", "assistant", "assistant"], history
        assert [m["id"] for m in history] == [f"{failed_id}-input", failed_id, retry_id]
        # Answered anew from that input (useChat's regenerate from a user message).
        again = await http.post(
            "/v1/ai-sdk/chat",
            json=body(
                "chat-flaky",
                history[0],
                trigger="regenerate-message",
                messageId=history[0]["id"],
            ),
            headers=auth(gateway),
        )
        assert again.status_code == 200, again.text
    history = await server_messages(gateway, "chat-flaky")
    assert [m["role"] for m in history] == ["user", "assistant"], history
    assert text_of(history[0]) == "flaky order 7"
    assert history[1]["id"] not in (failed_id, retry_id)
    assert history[1]["metadata"]["status"] == "completed"
