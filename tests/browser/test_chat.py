"""The browser client (client_demo/static) in real headless Chromium against a real gateway.

Each test drives the pages like a person would (typing, clicking) and waits on data-testid
selectors. A screenshot of each final page goes to test-artifacts/. With
GATEWAY_UPDATE_SCREENSHOTS=1 the approval test also refreshes docs/screenshot-approval.png.
"""

from __future__ import annotations

import os
import re
from typing import Any

import httpx
import pytest

from gateway.agents.demo.assistant import order_status_text, refund_text
from gateway.auth.access import TokenVerifier
from tests.support.browser import DESKTOP, PHONE, PageErrors, artifact, wait_until
from tests.support.client import Client
from tests.support.gateway import ROOT, TEST_SECRET, GatewayProcess, spawn_gateway

TIMEOUT_MS = 30_000
# `support`: the role the demo agent's approval rule reads (docs/protocol.md §9).
VERIFIER = TokenVerifier(TEST_SECRET, custom_roles={"support"})
UPDATE_DOCS_SCREENSHOT = os.environ.get("GATEWAY_UPDATE_SCREENSHOTS") == "1"

ASSISTANT_TEXT = "[data-role=assistant] [data-testid=message-text]"


@pytest.fixture(autouse=True)
def _expect_timeout() -> None:
    from playwright.async_api import expect

    expect.set_options(timeout=TIMEOUT_MS)


def token(user: str, *roles: str) -> str:
    return VERIFIER.issue(user, "acme", roles or ("user",))


async def open_chat(
    browser: Any,
    gateway: GatewayProcess,
    errors: PageErrors,
    user: str,
    *roles: str,
    viewport: dict[str, int] = DESKTOP,
) -> tuple[Any, Any]:
    """A fresh browser context (its own sessionStorage) signed in through #token=."""
    from playwright.async_api import expect

    context = await browser.new_context(viewport=viewport)
    page = await context.new_page()
    errors.attach(page, user)
    await page.goto(f"http://127.0.0.1:{gateway.port}/#token={token(user, *roles)}")
    await expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "online")
    # The token left the address bar at once.
    assert "token=" not in page.url
    return context, page


async def send(page: Any, text: str) -> None:
    box = page.get_by_test_id("composer-input")
    await box.fill(text)
    await box.press("Enter")


async def current_thread(page: Any) -> str:
    return str(await wait_until(lambda: page.evaluate("window.__gateway.currentThreadId()")))


async def stats(page: Any) -> dict[str, Any]:
    return dict(await page.evaluate("window.__gateway.stats()"))


async def server_events(gateway: GatewayProcess, thread_id: str, user: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
        response = await http.get(
            f"/v1/threads/{thread_id}/events",
            params={"limit": 1000},
            headers={"Authorization": f"Bearer {token(user)}"},
        )
    response.raise_for_status()
    return list(response.json()["events"])


async def completed_texts(gateway: GatewayProcess, thread_id: str, user: str) -> list[str]:
    events = await server_events(gateway, thread_id, user)
    return [e["data"]["text"] for e in events if e["event"] == "message.completed"]


async def watch_streaming(page: Any) -> None:
    """Record every distinct text the first assistant bubble shows, to prove it streamed."""
    await page.evaluate(
        """() => {
          window.__seen = [];
          const items = document.getElementById("items");
          new MutationObserver(() => {
            const el = items.querySelector('[data-role=assistant] [data-testid=message-text]');
            const seen = window.__seen;
            if (el && seen[seen.length - 1] !== el.textContent) seen.push(el.textContent);
          }).observe(items, {subtree: true, childList: true, characterData: true});
        }"""
    )


async def open_thread_from_list(page: Any, thread_id: str) -> None:
    from playwright.async_api import expect

    item = page.locator(f'[data-testid=thread-item][data-thread-id="{thread_id}"]')
    await expect(item).to_be_visible()
    await item.click()
    await expect(page.locator("[data-testid=chat-title]")).not_to_have_text("New chat")


async def shot(page: Any, name: str) -> None:
    await page.screenshot(path=str(artifact(f"{name}.png")))


# ---------------------------------------------------------------------------------------------


async def test_refund_streams_then_reviewer_approves_inline(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await watch_streaming(alice)
    await send(alice, "refund order 42 for 30 dollars")

    # The user's message, then the assistant's sentence streaming in delta by delta.
    await expect(alice.locator("[data-role=user] [data-testid=message-text]")).to_have_text(
        "refund order 42 for 30 dollars"
    )
    first = alice.locator(ASSISTANT_TEXT).first
    await expect(first).to_have_text(re.compile(r"^I will refund 30\.00 USD for order 42"))
    card = alice.get_by_test_id("approval-card")
    await expect(card).to_be_visible()
    seen = await alice.evaluate("window.__seen")
    final_sentence = await first.text_content()
    partial = [text for text in seen if text and text != final_sentence]
    assert len(partial) >= 3, f"the answer did not stream in: {seen!r}"
    assert all(final_sentence.startswith(text) for text in partial)

    # The owner sees the card without buttons; the tool call is a chip with its arguments.
    await expect(card.get_by_test_id("approval-tool")).to_have_text("issue_refund")
    await expect(card.get_by_test_id("approval-args")).to_contain_text('"order_id": 42')
    await expect(card.get_by_test_id("approval-waiting")).to_be_visible()
    await expect(card.get_by_test_id("approve-button")).to_be_hidden()
    await expect(alice.get_by_test_id("tool-call")).to_contain_text("order_id: 42")
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute(
        "data-status", "waiting_for_review"
    )
    thread_id = await current_thread(alice)

    # A reviewer in another browser context opens the thread and approves inline.
    _, bob = await open_chat(browser, gateway, page_errors, "bob", "reviewer")
    await open_thread_from_list(bob, thread_id)
    bob_card = bob.get_by_test_id("approval-card")
    await expect(bob_card.get_by_test_id("approve-button")).to_be_visible()
    await expect(bob_card.get_by_test_id("reject-button")).to_be_visible()
    await expect(bob_card.get_by_test_id("approval-reason")).to_be_visible()
    await expect(bob.get_by_test_id("inbox-item")).to_have_count(1)
    await bob.mouse.move(0, 0)
    await shot(bob, "approval-pending-reviewer")
    if UPDATE_DOCS_SCREENSHOT:
        await bob.screenshot(path=str(ROOT / "docs" / "screenshot-approval.png"))
    await bob_card.get_by_test_id("approve-button").click()

    expected = refund_text(42, 30.0)
    for page in (alice, bob):
        await expect(page.get_by_test_id("status-badge")).to_have_attribute(
            "data-status", "completed"
        )
        await expect(page.locator(ASSISTANT_TEXT).last).to_contain_text(expected)
        decided = page.get_by_test_id("approval-card")
        await expect(decided).to_have_attribute("data-status", "approved")
        await expect(decided.get_by_test_id("approval-decision")).to_contain_text("by bob")
        await expect(decided.get_by_test_id("approve-button")).to_be_hidden()
        await expect(page.get_by_test_id("tool-output")).to_be_visible()
    assert "Refund of 30.00 USD" in (await alice.locator(ASSISTANT_TEXT).last.text_content())
    await expect(bob.get_by_test_id("inbox-item")).to_have_count(0)
    await shot(alice, "approve-user")
    await shot(bob, "approve-reviewer")


async def test_a_reviewer_changes_the_amount_before_approving(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    # The demo's refunds take edited arguments (docs/protocol.md §4 "Approve with edits").
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "refund order 42 for 80 dollars")
    await expect(alice.get_by_test_id("approval-card")).to_be_visible()
    # The owner, who does not decide refunds, is offered no change either.
    await expect(alice.get_by_test_id("edit-arguments")).to_be_hidden()
    thread_id = await current_thread(alice)

    _, bob = await open_chat(browser, gateway, page_errors, "bob", "reviewer")
    await open_thread_from_list(bob, thread_id)
    card = bob.get_by_test_id("approval-card")
    await card.get_by_test_id("edit-arguments").click()
    editor = card.get_by_test_id("approval-args-editor")
    await expect(editor).to_be_focused()
    await editor.fill("{not json")
    await card.get_by_test_id("approve-button").click()
    await expect(card.get_by_test_id("approval-error")).to_have_text(
        "The arguments are not valid JSON."
    )
    await editor.fill('{"order_id": 42, "amount": 60}')
    await expect(card.get_by_test_id("approval-error")).to_be_hidden()
    await expect(card.get_by_test_id("approve-button")).to_have_text("Approve with changes")
    await shot(bob, "approve-with-changes")
    await card.get_by_test_id("approve-button").click()

    for page in (alice, bob):
        await expect(page.get_by_test_id("status-badge")).to_have_attribute(
            "data-status", "completed"
        )
        await expect(page.locator(ASSISTANT_TEXT).last).to_contain_text(refund_text(42, 60.0))
        decided = page.get_by_test_id("approval-card")
        await expect(decided.get_by_test_id("approval-edited")).to_be_visible()
        await expect(decided.get_by_test_id("approval-decision")).to_contain_text('"amount": 60')
    await shot(alice, "approved-with-changes")


async def test_reject_with_reason_reaches_the_answer(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "refund order 7 for 12 dollars")
    await expect(alice.get_by_test_id("approval-card")).to_be_visible()
    thread_id = await current_thread(alice)

    _, bob = await open_chat(browser, gateway, page_errors, "bob", "reviewer")
    await open_thread_from_list(bob, thread_id)
    reason = "Order 7 was already refunded <b>once</b> — see ticket #88."
    card = bob.get_by_test_id("approval-card")
    await card.get_by_test_id("approval-reason").fill(reason)
    await card.get_by_test_id("reject-button").click()

    for page in (alice, bob):
        await expect(page.get_by_test_id("status-badge")).to_have_attribute(
            "data-status", "completed"
        )
        await expect(page.locator(ASSISTANT_TEXT).last).to_contain_text(reason)
        decided = page.get_by_test_id("approval-card")
        await expect(decided).to_have_attribute("data-status", "rejected")
        await expect(decided.get_by_test_id("approval-decision-reason")).to_have_text(reason)
        # Text, never markup: the reason's tags are shown, not rendered.
        assert await page.locator("#items b").count() == 0
    await shot(alice, "reject-user")
    await shot(bob, "reject-reviewer")


async def test_connection_cut_mid_story_loses_and_doubles_nothing(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    context, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "tell me a story")
    story = alice.locator(ASSISTANT_TEXT).first
    await expect(story).to_have_text(re.compile(r"\S+( \S+){5,}"))
    thread_id = await current_thread(alice)

    # A second tab on the same thread that keeps its connection.
    _, other = await open_chat(browser, gateway, page_errors, "alice", "user")
    await open_thread_from_list(other, thread_id)

    # Cut the socket and keep the browser offline while the story goes on on the server.
    await context.set_offline(True)
    await alice.evaluate("window.__gateway.dropConnection()")
    await expect(alice.get_by_test_id("connection")).not_to_have_attribute("data-state", "online")
    shown = await story.text_content()
    before = len(await server_events(gateway, thread_id, "alice"))
    await wait_until(
        lambda: _grew(gateway, thread_id, before + 20), timeout=20, interval=0.1
    )  # at least 20 events happened while this page was offline
    await context.set_offline(False)
    await expect(alice.get_by_test_id("connection")).to_have_attribute("data-state", "online")

    for page in (alice, other):
        await expect(page.get_by_test_id("status-badge")).to_have_attribute(
            "data-status", "completed", timeout=60_000
        )
    texts = await completed_texts(gateway, thread_id, "alice")
    assert len(texts) == 1 and len(texts[0].split()) >= 200
    assert (await story.text_content()) == texts[0]
    assert shown and texts[0].startswith(shown)
    counters = await stats(alice)
    assert counters["deltaMismatches"] == 0
    assert counters["connection"]["reconnects"] >= 1
    assert counters["subscribedFrom"][thread_id] > 0, "did not resume from its cursor"
    # Both tabs show the same conversation, item for item.
    assert await _conversation(alice) == await _conversation(other)
    await expect(alice.locator(ASSISTANT_TEXT)).to_have_count(1)
    await shot(alice, "reconnect")


async def _grew(gateway: GatewayProcess, thread_id: str, count: int) -> bool:
    return len(await server_events(gateway, thread_id, "alice")) >= count


async def _conversation(page: Any) -> list[tuple[str | None, str]]:
    items = page.locator("#items > li")
    out = []
    for i in range(await items.count()):
        item = items.nth(i)
        out.append((await item.get_attribute("data-key"), (await item.text_content()) or ""))
    return out


async def test_reload_mid_stream_resumes_from_the_stored_cursor(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "tell me a story")
    story = alice.locator(ASSISTANT_TEXT).first
    await expect(story).to_have_text(re.compile(r"\S+( \S+){10,}"))
    thread_id = await current_thread(alice)

    await alice.reload()
    await expect(alice.get_by_test_id("connection")).to_have_attribute("data-state", "online")
    # The reloaded page resubscribed from where it was, not from the beginning.
    resumed_from = (await stats(alice))["subscribedFrom"].get(thread_id)
    assert resumed_from and resumed_from > 10, f"resumed from {resumed_from!r}"
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute(
        "data-status", "completed", timeout=60_000
    )
    texts = await completed_texts(gateway, thread_id, "alice")
    assert len(texts) == 1
    await expect(alice.locator(ASSISTANT_TEXT)).to_have_count(1)
    assert (await story.text_content()) == texts[0]
    assert (await stats(alice))["deltaMismatches"] == 0
    await expect(alice.locator("[data-role=user]")).to_have_count(1)
    await shot(alice, "reload")


async def test_reviewer_inbox_is_live(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, bob = await open_chat(browser, gateway, page_errors, "bob", "reviewer")
    inbox = bob.get_by_test_id("inbox")
    await expect(inbox).to_be_visible()
    await expect(bob.get_by_test_id("inbox-count")).to_have_text("0")

    # A user elsewhere (a plain protocol client) asks for a refund.
    carol = await Client.connect(f"ws://127.0.0.1:{gateway.port}/v1/ws", token("carol"))
    try:
        ack = await carol.request("run.start", input="please refund order 5 for 12.50")
        item = bob.get_by_test_id("inbox-item")
        await expect(item).to_have_count(1)
        await expect(item).to_contain_text("issue_refund")
        await expect(bob.get_by_test_id("inbox-count")).to_have_text("1")

        await item.click()
        card = bob.get_by_test_id("approval-card")
        await expect(card).to_be_in_viewport()
        await expect(bob.locator("[data-testid=chat-title]")).to_have_text(
            "please refund order 5 for 12.50"
        )
        await card.get_by_test_id("approve-button").click()
        await expect(bob.get_by_test_id("inbox-item")).to_have_count(0)
        await expect(bob.get_by_test_id("inbox-count")).to_have_text("0")
        await expect(card).to_have_attribute("data-status", "approved")
        await carol.wait_event("run.completed")
        assert ack["thread_id"] == await current_thread(bob)
        await expect(bob.get_by_test_id("status-badge")).to_have_attribute(
            "data-status", "completed"
        )
        await shot(bob, "inbox")
    finally:
        await carol.close()


async def test_phone_width_collapses_the_thread_list(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(
        browser, gateway, page_errors, "alice", "user", "reviewer", viewport=PHONE
    )
    await send(alice, "hello from a phone")
    await expect(alice.locator(ASSISTANT_TEXT).first).to_have_text('You said: "hello from a phone"')
    await expect(alice.get_by_test_id("new-chat")).not_to_be_in_viewport()
    await alice.get_by_test_id("menu").click()
    await expect(alice.get_by_test_id("new-chat")).to_be_in_viewport()
    await alice.get_by_test_id("new-chat").click()
    await expect(alice.get_by_test_id("empty-chat")).to_be_visible()
    await alice.get_by_test_id("menu").click()
    await alice.get_by_test_id("thread-item").first.click()
    await expect(alice.locator(ASSISTANT_TEXT).first).to_have_text('You said: "hello from a phone"')
    await expect(alice.get_by_test_id("new-chat")).not_to_be_in_viewport()  # drawer closed

    # Two approval cards with long arguments still fit the width; the buttons are reachable.
    await send(alice, "refund order 3 for 9.99 and email ann@example.com about the delay")
    await expect(alice.get_by_test_id("approval-card")).to_have_count(2)
    await expect(alice.get_by_test_id("approve-button").last).to_be_in_viewport()
    await expect(alice.get_by_test_id("chat-title")).to_be_in_viewport(ratio=1)
    for selector in ("document.documentElement", "document.getElementById('log')"):
        overflow = await alice.evaluate(f"{selector}.scrollWidth - {selector}.clientWidth")
        assert overflow <= 0, f"{selector} scrolls sideways by {overflow}px"
    box = await alice.get_by_test_id("approve-button").last.bounding_box()
    assert box and box["x"] + box["width"] <= PHONE["width"]
    await shot(alice, "phone")


async def test_the_user_confirms_their_own_email_but_waits_for_a_reviewer_on_a_refund(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    # The demo agent's `send_email` is decided by "either", `issue_refund` by a reviewer
    # (GATEWAY_SELF_APPROVAL is off): one pause, a button for one call and not the other.
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "refund order 5 for 12 and email ann@example.com about it")
    cards = alice.get_by_test_id("approval-card")
    await expect(cards).to_have_count(2)
    refund, email = cards.nth(0), cards.nth(1)
    await expect(refund.get_by_test_id("approval-tool")).to_have_text("issue_refund")
    await expect(refund.get_by_test_id("approve-button")).to_be_hidden()
    await expect(refund.get_by_test_id("approval-waiting")).to_have_text("Waiting for a reviewer")
    await expect(email.get_by_test_id("approval-tool")).to_have_text("send_email")
    await expect(email.get_by_test_id("approval-waiting")).to_be_hidden()
    await email.get_by_test_id("approve-button").click()
    await expect(email).to_have_attribute("data-status", "approved")
    await expect(email.get_by_test_id("approval-decision")).to_contain_text("by alice")
    await expect(refund).to_have_attribute("data-status", "pending")
    await shot(alice, "user-confirms-email")

    # A reviewer decides the refund; the run goes on with both decisions.
    thread_id = await current_thread(alice)
    _, bob = await open_chat(browser, gateway, page_errors, "bob", "reviewer")
    await open_thread_from_list(bob, thread_id)
    await bob.get_by_test_id("approval-card").nth(0).get_by_test_id("approve-button").click()
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "completed")
    final = await alice.locator(ASSISTANT_TEXT).last.text_content()
    assert "Refund of 12.00 USD" in (final or "")
    assert "Email sent to ann@example.com" in (final or "")


async def test_input_while_busy_is_queued_and_cancel_keeps_the_partial_answer(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "tell me a story")
    story = alice.locator(ASSISTANT_TEXT).first
    await expect(story).to_have_text(re.compile(r"\S+( \S+){5,}"))
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "running")

    await send(alice, "hello again")
    queued = alice.locator("[data-role=user][data-state=queued]")
    await expect(queued).to_have_count(1)
    await expect(queued.get_by_test_id("input-state")).to_contain_text(
        "answered once the current answer is finished"
    )
    partial = await story.text_content()

    await alice.get_by_test_id("cancel-run").click()
    # The story's message is stopped (its partial text stays, marked), then the queued input
    # runs.
    await expect(alice.get_by_test_id("notice")).to_contain_text("Stopped.")
    await expect(alice.locator(ASSISTANT_TEXT).last).to_have_text('You said: "hello again"')
    await expect(alice.locator(ASSISTANT_TEXT)).to_have_count(2)
    kept = (await alice.locator(ASSISTANT_TEXT).first.text_content()) or ""
    assert partial and kept.startswith(partial)
    await expect(alice.get_by_test_id("message-stopped").first).to_be_visible()
    await expect(alice.get_by_test_id("message-stopped").locator("visible=true")).to_have_count(1)
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "completed")
    await expect(queued).to_have_count(0)
    users = alice.locator("[data-role=user] [data-testid=message-text]")
    await expect(users).to_have_text(["tell me a story", "hello again"])
    await shot(alice, "queued-cancel")


async def test_input_while_waiting_for_review_is_staged(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "refund order 9 for 5 dollars")
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute(
        "data-status", "waiting_for_review"
    )
    await send(alice, "thanks, no rush")
    staged = alice.locator("[data-role=user][data-state=staged]")
    await expect(staged).to_have_count(1)
    await expect(staged.get_by_test_id("input-state")).to_contain_text(
        "read once the approval is decided"
    )
    await expect(alice.get_by_test_id("composer-input")).to_have_attribute(
        "placeholder", "Add a message…"
    )
    await expect(alice.get_by_test_id("pending-message")).to_have_count(0)

    await alice.get_by_test_id("cancel-run").click()
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "cancelled")
    card = alice.get_by_test_id("approval-card")
    await expect(card).to_have_attribute("data-status", "superseded")
    await expect(card.get_by_test_id("approval-waiting")).to_be_hidden()
    await expect(alice.get_by_test_id("cancel-run")).to_be_hidden()
    await shot(alice, "staged-cancel")


async def test_pasted_token_sign_in(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    page_errors.attach(page, "anonymous")
    await page.goto(f"http://127.0.0.1:{gateway.port}/")
    # GATEWAY_SECRET is set: no development form, only the token form.
    await expect(page.get_by_test_id("token-signin")).to_be_visible()
    await expect(page.get_by_test_id("signin")).to_have_attribute("data-mode", "token")
    await expect(page.get_by_test_id("dev-signin")).to_be_hidden()
    await page.get_by_test_id("token-input").fill("not-a-token")
    await page.get_by_test_id("token-submit").click()
    await expect(page.get_by_test_id("token-error")).to_be_visible()
    await page.get_by_test_id("token-input").fill(token("dave", "user"))
    await page.get_by_test_id("token-submit").click()
    await expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "online")
    await expect(page.get_by_test_id("me-name")).to_have_text("dave")
    await shot(page, "token-signin")


async def test_development_sign_in_form(
    browser: Any, tmp_path: Any, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    # No GATEWAY_SECRET: the gateway issues development tokens at POST /v1/dev/token.
    gateway = spawn_gateway(tmp_path, env={"GATEWAY_SECRET": "", "GATEWAY_DEMO_DELAY_MS": "5"})
    try:
        context = await browser.new_context(viewport=DESKTOP)
        page = await context.new_page()
        page_errors.attach(page, "erin")
        await page.goto(f"http://127.0.0.1:{gateway.port}/")
        form = page.get_by_test_id("dev-signin")
        await expect(form).to_be_visible()
        await expect(page.get_by_test_id("dev-tenant")).to_have_value("demo")
        await page.get_by_test_id("dev-user").fill("erin")
        await page.get_by_test_id("role-reviewer").check()
        await shot(page, "dev-signin-form")
        await page.get_by_test_id("dev-submit").click()

        await expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "online")
        await expect(page.get_by_test_id("me-name")).to_have_text("erin")
        await expect(page.get_by_test_id("inbox")).to_be_visible()  # reviewer role
        markup = "<img src=x onerror=\"document.title='owned'\"> hi"
        await send(page, markup)
        await expect(page.locator(ASSISTANT_TEXT).first).to_have_text(f'You said: "{markup}"')
        await expect(page.get_by_test_id("status-badge")).to_have_attribute(
            "data-status", "completed"
        )
        assert await page.locator("#items img").count() == 0
        assert await page.title() != "owned"
        await shot(page, "dev-signin")
    finally:
        gateway.terminate()


async def test_regenerate_keeps_the_earlier_answer_as_a_version(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "hello there")
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "completed")
    await expect(alice.get_by_test_id("regenerate")).to_be_visible()
    await alice.get_by_test_id("regenerate").click()
    answers = alice.locator(ASSISTANT_TEXT)
    await expect(answers).to_have_text(['You said: "hello there"', 'You said: "hello there"'])
    await expect(alice.get_by_test_id("message-replaced").locator("visible=true")).to_have_count(1)
    first = alice.locator("[data-role=assistant]").first
    await expect(first.get_by_test_id("message-replaced")).to_be_visible()
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "completed")
    await shot(alice, "regenerated")


async def test_try_again_goes_on_from_where_a_failed_answer_stopped(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    # The offline model fails the answer after a lookup once (docs/protocol.md §9 `flaky`).
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "a flaky lookup of order 7")
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "failed")
    retry = alice.get_by_test_id("retry")
    await expect(retry).to_be_visible()
    await shot(alice, "failed-answer")
    await retry.click()
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "completed")
    # The lookup is not made again: one tool result, then the answer that quotes it.
    await expect(alice.locator(ASSISTANT_TEXT).last).to_contain_text("Here is what happened:")
    await expect(alice.locator(ASSISTANT_TEXT).last).to_contain_text(order_status_text(7))
    await expect(alice.get_by_test_id("tool-output")).to_have_count(1)
    # The question is shown once: the conversation goes on from it.
    await expect(alice.locator("[data-role=user]")).to_have_count(1)
    await expect(retry).to_be_hidden()
    await shot(alice, "retried-answer")


async def test_a_small_refund_by_support_is_approved_by_the_demos_rule(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    # `refund_up_to_50` decides the call by itself: no buttons, no waiting, the rule named.
    from playwright.async_api import expect

    _, sam = await open_chat(browser, gateway, page_errors, "sam", "user", "support")
    await send(sam, "refund order 6 for 20")
    await expect(sam.get_by_test_id("status-badge")).to_have_attribute("data-status", "completed")
    card = sam.get_by_test_id("approval-card")
    await expect(card).to_have_attribute("data-status", "approved")
    await expect(card.get_by_test_id("approval-decision")).to_contain_text(
        "by the rule refund_up_to_50"
    )
    await expect(card.get_by_test_id("approve-button")).to_be_hidden()
    await expect(sam.locator(ASSISTANT_TEXT).last).to_contain_text(refund_text(6, 20.0))
    await shot(sam, "rule-approves-refund")


async def test_the_models_reasoning_shows_folded_above_its_answer(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    await send(alice, "think about cats")
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "completed")
    reasoning = alice.get_by_test_id("reasoning")
    await expect(reasoning).to_have_count(1)
    await expect(reasoning.locator("summary")).to_have_text("Thought it over")
    await reasoning.locator("summary").click()
    await expect(reasoning.get_by_test_id("reasoning-text")).to_have_text(
        "The user asks me to think about: think about cats\n\nQuoting it back will do."
    )
    await expect(alice.locator(ASSISTANT_TEXT)).to_have_text(['You said: "think about cats"'])
    await shot(alice, "reasoning")
