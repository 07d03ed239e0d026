"""The useChat example of docs/frontend.md ("Vercel AI SDK"), as it is on the page: compiled
from its TSX, rendered by react-test-renderer in Node with the pinned `ai` and @ai-sdk/react,
and clicked through against a real gateway."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gateway.agents.demo.assistant import refund_text
from tests.frontends.test_ai_sdk import REFUND, auth, server_messages
from tests.support.gateway import ROOT, Gateway
from tests.support.node_scripts import node_script

EXAMPLE_GATEWAY = 'const GATEWAY = "https://gateway.example.com";'
WAITING = "Waiting for a reviewer…"


def example_source(gateway: Gateway) -> str:
    page = (ROOT / "docs" / "frontend.md").read_text(encoding="utf-8")
    [example] = [
        block
        for block in re.findall(r"```tsx\n(.*?)```", page, flags=re.S)
        if "new WebSocketChatTransport(" in block
    ]
    assert EXAMPLE_GATEWAY in example
    return example.replace(EXAMPLE_GATEWAY, f'const GATEWAY = "{gateway.http_url}";')


def config(gateway: Gateway, chat_id: str) -> dict[str, Any]:
    return {
        "source": example_source(gateway),
        "token": gateway.token("alice", "user"),
        "chatId": chat_id,
    }


def texts(history: list[dict[str, Any]]) -> list[str]:
    """The text parts of the messages, in order: one paragraph each on the page."""
    return [p["text"] for m in history for p in m["parts"] if p["type"] == "text" and p["text"]]


async def test_the_use_chat_example_approves_inline_and_a_reload_shows_the_history(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory(self_approval=True) as gateway:
        async with node_script(
            "ai_sdk_docs.mjs", config(gateway, "docs-chat"), package="esbuild"
        ) as page:
            loaded = await page.until("loaded")
            assert loaded["messages"] == [] and loaded["buttons"] == ["Ask"]
            page.tell({})
            asked = await page.until("asked")
            # alice may decide her own run's call here: buttons, not a wait.
            assert asked["buttons"][:2] == ["Approve", "Reject"]
            assert WAITING not in asked["paragraphs"]
            done = await page.until("done", timeout_s=60)
        history = await server_messages(gateway, "docs-chat")
        assert [m["role"] for m in history] == ["user", "assistant"]
        assert history[1]["metadata"]["status"] == "completed"
        # One assistant message, from the question to the answer after the approval.
        assert (
            done["paragraphs"]
            == texts(history)
            == [
                REFUND,
                "I will refund 30.00 USD for order 42; this needs your approval.",
                f"Here is what happened:\n- {refund_text(42, 30.0)}\nIs there anything else I can "
                "help with?",
            ]
        )
        # The page again: its history from the gateway, as it was.
        async with node_script(
            "ai_sdk_docs.mjs", config(gateway, "docs-chat"), package="esbuild"
        ) as page:
            reloaded = await page.until("loaded")
        assert reloaded["messages"] == history
        assert reloaded["paragraphs"] == done["paragraphs"]


async def test_the_use_chat_example_waits_while_a_reviewer_decides(
    gateway_factory: Callable[..., Any],
) -> None:
    async with gateway_factory() as gateway:
        async with node_script(
            "ai_sdk_docs.mjs", config(gateway, "docs-review"), package="esbuild"
        ) as page:
            await page.until("loaded")
            page.tell({})
            asked = await page.until("asked")
            # Only a reviewer may decide: no buttons for alice, and the response stays open.
            assert WAITING in asked["paragraphs"]
            assert "Approve" not in asked["buttons"] and asked["buttons"] == ["Stop"]
            async with gateway.http() as http:
                pending = await http.get("/v1/approvals", headers=auth(gateway, "bob", "reviewer"))
                [approval] = pending.json()["approvals"]
                decided = await http.post(
                    f"/v1/approvals/{approval['approval_id']}/decision",
                    json={"decision": "approve"},
                    headers=auth(gateway, "bob", "reviewer"),
                )
            assert decided.status_code == 200, decided.text
            page.tell({})
            done = await page.until("done", timeout_s=60)
        history = await server_messages(gateway, "docs-review")
    assert done["paragraphs"] == texts(history)
    assert refund_text(42, 30.0) in done["paragraphs"][-1]
    assert WAITING not in done["paragraphs"]
