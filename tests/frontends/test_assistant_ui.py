"""assistant-ui's AI SDK adapter on the gateway's useChat endpoints: `useAISDKRuntime`
(@assistant-ui/react-ai-sdk, as pinned in tests/frontends/node) over the AI SDK's own `useChat`,
rendered by react-test-renderer in Node and driven through assistant-ui's runtime API against a
real gateway (docs/frontend.md "Vercel AI SDK")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.agents.demo.assistant import refund_text
from tests.frontends.test_ai_sdk import (
    REFUND,
    STORY,
    TRANSPORTS,
    auth,
    comparable,
    events_of,
    eventually_status,
    server_messages,
    text_of,
)
from tests.support.gateway import Gateway
from tests.support.node_scripts import node_script

PACKAGE = "@assistant-ui/react-ai-sdk"
# The demo's stories are longer than this; one stopped after a few words is far shorter.
STORY_MIN_CHARS = 1000


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


async def run_thread(
    gateway: Gateway, scenario: str, transport: str, chat_id: str, **extra: Any
) -> dict[str, Any]:
    async with node_script(
        "assistant_ui.mjs", config(gateway, scenario, transport, chat_id, **extra), package=PACKAGE
    ) as script:
        return await script.until("done", timeout_s=60)


def shown(result: dict[str, Any]) -> dict[str, Any]:
    """The one assistant message assistant-ui's thread shows."""
    messages = [m for m in result["thread"] if m["role"] == "assistant"]
    assert len(messages) == 1, result["thread"]
    return messages[0]


def chat_assistant(result: dict[str, Any]) -> dict[str, Any]:
    messages = [m for m in result["messages"] if m["role"] == "assistant"]
    assert len(messages) == 1, result["messages"]
    return messages[0]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_assistant_ui_shows_a_streamed_message(gateway: Gateway, transport: str) -> None:
    chat_id = f"aui-{transport}-hello"
    result = await run_thread(gateway, "stream", transport, chat_id, text="hello there")
    assert result["status"] == "ready" and result["error"] is None, result
    message = shown(result)
    assert message["text"] == 'You said: "hello there"'
    assert message["status"] == "complete"
    # assistant-ui shows the useChat message, whose id is the gateway's run id.
    history = await server_messages(gateway, chat_id)
    assert message["id"] == history[1]["id"] == history[1]["metadata"]["runId"]
    assert comparable(history[1]) == comparable(chat_assistant(result))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_assistant_ui_approves_a_call_and_the_same_message_continues(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    async with gateway_factory(self_approval=True) as gateway:
        chat_id = f"aui-{transport}-approve"
        async with node_script(
            "assistant_ui.mjs",
            config(gateway, "approve", transport, chat_id, text=REFUND),
            package=PACKAGE,
        ) as script:
            asked = await script.until("approval")
            result = await script.until("done", timeout_s=60)
        # The gateway's descriptor reaches assistant-ui's tool part: an app can hide the
        # buttons from a reader who may not decide.
        assert asked["approval"]["descriptor"]["canDecide"] is True
        assert asked["status"]["type"] == "requires-action"
        assert result["status"] == "ready" and result["error"] is None, result
        message = shown(result)
        [call] = [p for p in message["content"] if p["type"] == "tool-call"]
        assert call["toolName"] == "issue_refund"
        assert call["approval"]["id"] == asked["approval"]["id"]
        assert call["approval"]["approved"] is True
        assert call["result"] == refund_text(42, 30.0)
        assert "needs your approval" in message["text"]
        assert refund_text(42, 30.0) in message["text"]
        assert message["status"] == "complete"
        events = await events_of(gateway, chat_id)
        decided = [e for e in events if e["event"] == "approval.decided"]
        assert [(d["data"]["decision"], d["data"]["reviewer"]) for d in decided] == [
            ("approve", "alice")
        ]
        # One run, one message: the continuation came into the message assistant-ui showed.
        assert {e["run_id"] for e in events} == {message["id"]}
        history = await server_messages(gateway, chat_id)
        assert comparable(history[1]) == comparable(chat_assistant(result))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_use_chat_runtime_names_the_chat_itself_and_approves_inline(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    """assistant-ui's own useChatRuntime (over AssistantChatTransport for HTTP): the chat id is
    assistant-ui's local thread id, which the gateway takes as the thread's."""
    async with gateway_factory(self_approval=True) as gateway:
        result = await run_thread(
            gateway, "approve", transport, None, runtime="useChatRuntime", text=REFUND
        )
        assert result["status"] == "ready" and result["error"] is None, result
        thread_id = result["threadId"]
        assert thread_id.startswith("__LOCALID_")
        message = shown(result)
        [call] = [p for p in message["content"] if p["type"] == "tool-call"]
        assert call["approval"]["approved"] is True
        assert call["result"] == refund_text(42, 30.0)
        assert message["status"] == "complete"
        history = await server_messages(gateway, thread_id)
        assert history[1]["metadata"]["threadId"] == thread_id
        assert comparable(history[1]) == comparable(chat_assistant(result))
        async with gateway.http() as http:
            listed = (await http.get("/v1/threads", headers=auth(gateway))).json()["threads"]
        assert [t["owner"] for t in listed if t["thread_id"] == thread_id] == ["alice"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_assistant_ui_cancel_stops_the_run_and_keeps_the_text(
    gateway_factory: Callable[..., Any], transport: str
) -> None:
    async with gateway_factory(demo_delay_ms=20) as gateway:
        chat_id = f"aui-{transport}-stop"
        result = await run_thread(
            gateway, "stop", transport, chat_id, text=STORY, stopAfterChars=30
        )
        message = shown(result)
        await eventually_status(gateway, message["id"], "cancelled")
        history = await server_messages(gateway, chat_id)
    assert len(message["text"]) >= 30
    # What assistant-ui showed stays in the server's message, which has at most a little more.
    assert text_of(history[1]).startswith(message["text"])
    assert len(text_of(history[1])) < STORY_MIN_CHARS
    assert history[1]["metadata"]["status"] == "cancelled"


async def test_assistant_ui_rejoins_an_active_response_after_a_reload(
    gateway_factory: Callable[..., Any],
) -> None:
    # Slow enough that the story (about 240 deltas) is still streaming once Node has started
    # and mounted: at 10 ms a delta a loaded two-core machine had finished it first.
    async with gateway_factory(demo_delay_ms=30) as gateway:
        undisturbed = shown(await run_thread(gateway, "stream", "ws", "aui-calm", text=STORY))
        assert len(undisturbed["text"]) > STORY_MIN_CHARS
        # A tab sends the story and closes after a few deltas (a closed tab stops nothing).
        body = {
            "id": "aui-reload",
            "trigger": "submit-message",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": STORY}]}],
        }
        async with (
            httpx.AsyncClient(base_url=gateway.http_url, timeout=20) as http,
            http.stream("POST", "/v1/ai-sdk/chat", json=body, headers=auth(gateway)) as streamed,
        ):
            deltas = 0
            lines = streamed.aiter_lines()
            while deltas < 10:
                deltas += '"text-delta"' in await anext(lines)
        # The page again: the chat's past from the gateway, and resume: true.
        before = await server_messages(gateway, "aui-reload")
        assert before[1]["metadata"]["status"] == "running"
        async with node_script(
            "assistant_ui.mjs",
            config(gateway, "resume", "ws", "aui-reload", resume=True, messages=before),
            package=PACKAGE,
        ) as script:
            await script.until("rejoined")
            # Rejoined mid-run: the gateway is still telling the story.
            during = await server_messages(gateway, "aui-reload")
            assert during[1]["metadata"]["status"] == "running", during[1]["metadata"]
            result = await script.until("done", timeout_s=60)
        history = await server_messages(gateway, "aui-reload")
    assert result["status"] == "ready" and result["error"] is None, result
    message = shown(result)
    assert [m["role"] for m in result["thread"]] == ["user", "assistant"]
    assert message["text"] == undisturbed["text"] == text_of(history[1])
    assert history[1]["metadata"]["status"] == "completed"
