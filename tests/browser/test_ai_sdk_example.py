"""The useChat example app (client_demo/examples/ai-sdk, served by the demo gateway at
/examples/ai-sdk/) in real headless Chromium against a real gateway in development mode: signed
in through the development token endpoint, useChat over WebSocketChatTransport as the pinned
`ai` and @ai-sdk/react give them. Screenshots of the final pages go to test-artifacts/."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.agents.demo.assistant import refund_text
from tests.support.browser import DESKTOP, PageErrors, artifact, unavailable
from tests.support.gateway import ROOT, GatewayProcess, spawn_gateway

TIMEOUT_MS = 30_000
EXAMPLE_DIST = ROOT / "client_demo" / "examples" / "ai-sdk" / "dist"
# The phone size the example is checked at (a common phone's CSS viewport).
PHONE = {"width": 390, "height": 844}
REFUND = "refund order 42 for 30 dollars"
STORY = "tell me a story about a lighthouse"
# A refund only a reviewer decides, and an e-mail its own user may confirm (the demo's
# `decided_by`): one pause, two calls.
MIXED = "refund order 42 for 30 dollars and email bob@example.com about it"
ASSISTANT = "[data-testid=message][data-role=assistant]"


@pytest.fixture(autouse=True)
def _expect_timeout() -> None:
    from playwright.async_api import expect

    expect.set_options(timeout=TIMEOUT_MS)


def spawn_example_gateway(tmp_path: Path, *, self_approval: bool) -> GatewayProcess:
    """Development mode (the page signs in at /v1/dev/token), and stories that stream slowly
    enough to reload or stop in the middle of one."""
    if not (EXAMPLE_DIST / "index.html").is_file():
        unavailable(
            "the useChat example is not built (python3 dev.py test builds it with Node.js and npm)"
        )
    return spawn_gateway(
        tmp_path,
        env={
            "GATEWAY_SECRET": "",
            "GATEWAY_SELF_APPROVAL": "true" if self_approval else "false",
            "GATEWAY_DEMO_DELAY_MS": "10",
        },
    )


@pytest.fixture
def example_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    """The owner decides their own approvals."""
    process = spawn_example_gateway(tmp_path, self_approval=True)
    try:
        yield process
    finally:
        process.terminate()


@pytest.fixture
def reviewed_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    """Only reviewers decide (the gateway's default)."""
    process = spawn_example_gateway(tmp_path, self_approval=False)
    try:
        yield process
    finally:
        process.terminate()


def base(gateway: GatewayProcess) -> str:
    return f"http://127.0.0.1:{gateway.port}"


async def open_example(
    browser: Any, gateway: GatewayProcess, errors: PageErrors, viewport: dict[str, int]
) -> tuple[Any, Any]:
    """A fresh context at /examples/ai-sdk/, signed in as alice through the page's form."""
    from playwright.async_api import expect

    context = await browser.new_context(viewport=viewport)
    page = await context.new_page()
    errors.attach(page, "example")
    # The trailing slash is the demo's redirect: the page's relative URLs resolve below it.
    await page.goto(f"{base(gateway)}/examples/ai-sdk")
    assert page.url.endswith("/examples/ai-sdk/") or "/examples/ai-sdk/?" in page.url
    await page.get_by_test_id("signin-user").fill("alice")
    await page.get_by_test_id("signin-role").select_option("user")
    await page.get_by_test_id("signin-submit").click()
    await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "ready")
    await expect(page.get_by_test_id("who")).to_have_text("alice (user)")
    return context, page


async def send(page: Any, text: str) -> None:
    await page.get_by_test_id("composer-input").fill(text)
    await page.get_by_test_id("send").click()


async def chat_id(page: Any) -> str:
    value = await page.get_by_test_id("chat").get_attribute("data-chat-id")
    assert value and f"chat={value}" in page.url  # a reload finds the same chat
    return str(value)


async def page_text(message: Any) -> str:
    return "".join(await message.get_by_test_id("message-text").all_text_contents())


async def dev_headers(http: httpx.AsyncClient, user: str, role: str = "user") -> dict[str, str]:
    token = (await http.post("/v1/dev/token", json={"user": user, "roles": [role]})).json()
    return {"Authorization": f"Bearer {token['token']}"}


async def server_messages(gateway: GatewayProcess, chat: str) -> list[dict[str, Any]]:
    """What the gateway holds for the chat, read as alice with a token of her own."""
    async with httpx.AsyncClient(base_url=base(gateway)) as http:
        answer = await http.get(
            f"/v1/ai-sdk/chat/{chat}/messages", headers=await dev_headers(http, "alice")
        )
    assert answer.status_code == 200, answer.text
    return list(answer.json()["messages"])


def text_of(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in message["parts"] if p["type"] == "text")


async def screenshots(page: Any, name: str) -> None:
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        await page.set_viewport_size(viewport)
        await page.mouse.move(0, 0)
        await page.screenshot(path=str(artifact(f"ai-sdk-example-{name}-{label}.png")))


async def test_a_message_streams_and_the_owner_approves_a_refund_inline(
    browser: Any, example_gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    context, page = await open_example(browser, example_gateway, page_errors, DESKTOP)
    chat = await chat_id(page)
    assistant = page.locator(ASSISTANT)

    await send(page, "hello there")
    await expect(assistant).to_have_count(1)
    await expect(assistant.first.get_by_test_id("message-text")).to_have_text(
        'You said: "hello there"'
    )
    await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "ready")

    await send(page, REFUND)
    await expect(assistant).to_have_count(2)
    refund = assistant.nth(1)
    tool = refund.get_by_test_id("tool")
    await expect(tool).to_have_attribute("data-state", "approval-requested")
    # alice owns the run and the gateway lets owners decide: buttons, not a wait.
    await expect(tool.get_by_test_id("approve")).to_be_visible()
    await expect(tool.get_by_test_id("reject")).to_be_visible()
    await expect(tool.get_by_test_id("waiting-reviewer")).to_have_count(0)
    await screenshots(page, "approval")
    await page.set_viewport_size(DESKTOP)
    await tool.get_by_test_id("approve").click()

    # The same assistant message continues past the pause to the final answer.
    await expect(tool).to_have_attribute("data-state", "output-available")
    await expect(tool.get_by_test_id("tool-output")).to_have_text(refund_text(42, 30.0))
    await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "ready")
    await expect(assistant).to_have_count(2)
    await expect(page.get_by_test_id("error")).to_have_count(0)
    history = await server_messages(example_gateway, chat)
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[3]["metadata"]["status"] == "completed"
    assert "needs your approval" in text_of(history[3])
    assert refund_text(42, 30.0) in text_of(history[3])
    assert await page_text(refund) == text_of(history[3])
    assert await page_text(assistant.first) == text_of(history[1])
    await screenshots(page, "approved")
    await context.close()


async def test_a_reload_mid_stream_rejoins_and_ends_as_an_undisturbed_run(
    browser: Any, example_gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    # The same prompt in a chat of its own, undisturbed: the demo model is deterministic.
    context, page = await open_example(browser, example_gateway, page_errors, PHONE)
    await send(page, STORY)
    await expect(page.get_by_test_id("stop")).to_be_visible()
    await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "ready")
    undisturbed = await page_text(page.locator(ASSISTANT).first)
    assert len(undisturbed.split()) >= 200

    await page.get_by_role("button", name="New chat").click()
    await expect(page.locator(ASSISTANT)).to_have_count(0)
    chat = await chat_id(page)
    await send(page, STORY)
    assistant = page.locator(ASSISTANT)
    await expect(assistant.first.get_by_test_id("message-text")).not_to_have_text("")
    before = await page_text(assistant.first)
    await page.reload()
    # The reload landed mid-run: the gateway had not finished the story.
    during = await server_messages(example_gateway, chat)
    assert during[-1]["metadata"]["status"] == "running", during[-1]["metadata"]

    await expect(page.get_by_test_id("chat")).to_have_attribute("data-chat-id", chat)
    await expect(page.get_by_test_id("stop")).to_be_visible()
    await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "ready")
    await expect(assistant).to_have_count(1)
    await expect(page.locator("[data-testid=message][data-role=user]")).to_have_count(1)
    await expect(page.get_by_test_id("error")).to_have_count(0)
    final = await page_text(assistant.first)
    assert before and final.startswith(before) and len(final) > len(before)
    assert final == undisturbed
    history = await server_messages(example_gateway, chat)
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert history[1]["metadata"]["status"] == "completed"
    assert text_of(history[1]) == final
    await screenshots(page, "resumed")
    await context.close()


async def test_a_reviewers_call_waits_without_buttons_and_stop_cancels_a_story(
    browser: Any, reviewed_gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    context = await browser.new_context(viewport=PHONE)
    page = await context.new_page()
    page_errors.attach(page, "example")
    await page.goto(f"{base(reviewed_gateway)}/examples/ai-sdk/")
    await expect(page.get_by_test_id("signin")).to_be_visible()
    await page.screenshot(path=str(artifact("ai-sdk-example-signin-phone.png")))
    await page.get_by_test_id("signin-submit").click()
    await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "ready")
    chat = await chat_id(page)

    await send(page, REFUND)
    tool = page.get_by_test_id("tool")
    await expect(tool).to_have_attribute("data-state", "approval-requested")
    # Only a reviewer may decide: alice sees the call wait, with no buttons to press.
    await expect(tool.get_by_test_id("waiting-reviewer")).to_be_visible()
    await expect(tool.get_by_test_id("approve")).to_have_count(0)
    await expect(page.get_by_test_id("stop")).to_be_visible()
    await screenshots(page, "waiting")
    async with httpx.AsyncClient(base_url=base(reviewed_gateway)) as http:
        bob = await dev_headers(http, "bob", "reviewer")
        [approval] = (await http.get("/v1/approvals", headers=bob)).json()["approvals"]
        decided = await http.post(
            f"/v1/approvals/{approval['approval_id']}/decision",
            json={"decision": "approve"},
            headers=bob,
        )
    assert decided.status_code == 200, decided.text
    # The continuation arrives in the open response.
    await expect(tool).to_have_attribute("data-state", "output-available")
    await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "ready")
    await expect(page.locator(ASSISTANT)).to_have_count(1)

    await send(page, STORY)
    story = page.locator(ASSISTANT).nth(1)
    await expect(story.get_by_test_id("message-text")).not_to_have_text("")
    await page.get_by_test_id("stop").click()
    await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "ready")
    await expect(page.get_by_test_id("send")).to_be_visible()
    shown = await page_text(story)
    history = await server_messages(reviewed_gateway, chat)
    for _ in range(100):
        if history[-1]["metadata"]["status"] != "running":
            break
        await asyncio.sleep(0.05)
        history = await server_messages(reviewed_gateway, chat)
    # The run was cancelled on the gateway; what the page shows stays in its message.
    assert history[-1]["metadata"]["status"] == "cancelled"
    assert shown and text_of(history[-1]).startswith(shown)
    assert len(text_of(history[-1])) < 1000  # far from the end of a story
    await expect(page.get_by_test_id("error")).to_have_count(0)
    await context.close()


async def test_the_users_answer_goes_out_while_a_reviewers_call_still_waits(
    browser: Any, reviewed_gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    """One pause, two calls: alice confirms the e-mail, which the page sends at once, and the
    response follows the run until a reviewer approves the refund."""
    from playwright.async_api import expect

    context, page = await open_example(browser, reviewed_gateway, page_errors, DESKTOP)
    chat = await chat_id(page)
    await send(page, MIXED)
    tools = page.get_by_test_id("tool")
    await expect(tools).to_have_count(2)
    refund, email = tools.filter(has_text="issue_refund"), tools.filter(has_text="send_email")
    await expect(refund.get_by_test_id("waiting-reviewer")).to_be_visible()
    await email.get_by_test_id("approve").click()
    async with httpx.AsyncClient(base_url=base(reviewed_gateway)) as http:
        bob = await dev_headers(http, "bob", "reviewer")
        # alice's answer reached the gateway on its own, the refund still waiting for bob.
        for _ in range(200):
            pending = (await http.get("/v1/approvals", headers=bob)).json()["approvals"]
            if [a["tool_name"] for a in pending] == ["issue_refund"]:
                break
            await asyncio.sleep(0.05)
        assert [a["tool_name"] for a in pending] == ["issue_refund"], pending
        await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "streaming")
        decided = await http.post(
            f"/v1/approvals/{pending[0]['approval_id']}/decision",
            json={"decision": "approve"},
            headers=bob,
        )
    assert decided.status_code == 200, decided.text
    await expect(email).to_have_attribute("data-state", "output-available")
    await expect(refund).to_have_attribute("data-state", "output-available")
    await expect(page.get_by_test_id("chat")).to_have_attribute("data-status", "ready")
    await expect(page.locator(ASSISTANT)).to_have_count(1)
    history = await server_messages(reviewed_gateway, chat)
    assert history[-1]["metadata"]["status"] == "completed"
    await expect(page.get_by_test_id("error")).to_have_count(0)
    await context.close()
