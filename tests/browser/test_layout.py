"""The demo page's layout in real headless Chromium, at a desktop's and a phone's size.

The page is an app shell: the header and the composer stay put and only the conversation log
and the sidebar scroll. Nothing the page shows may make the document itself scroll.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.test_chat import TIMEOUT_MS, shot, token
from tests.support.browser import DESKTOP, PageErrors
from tests.support.client import Client
from tests.support.gateway import GatewayProcess, spawn_gateway

# The phone of the layout checks: a common handset's CSS viewport.
TALL_PHONE = {"width": 390, "height": 844}


@pytest.fixture(autouse=True)
def _expect_timeout() -> None:
    from playwright.async_api import expect

    expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture
def quick_gateway(tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    process = spawn_gateway(tmp_path, env={"GATEWAY_DEMO_DELAY_MS": "0"})
    try:
        yield process
    finally:
        process.terminate()


async def reviewer_page(
    browser: Any, gateway: GatewayProcess, errors: PageErrors, viewport: dict[str, int]
) -> Any:
    from playwright.async_api import expect

    context = await browser.new_context(viewport=viewport)
    page = await context.new_page()
    errors.attach(page, f"bob {viewport['width']}")
    await page.goto(f"http://127.0.0.1:{gateway.port}/#token={token('bob', 'reviewer')}")
    await expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "online")
    # Every scroll of the document is remembered, however briefly it lasted.
    await page.evaluate(
        """() => {
          window.__documentScrolls = [];
          window.addEventListener("scroll", () => window.__documentScrolls.push(window.scrollY));
        }"""
    )
    return page


async def document_scroll(page: Any) -> dict[str, Any]:
    return dict(
        await page.evaluate(
            """() => ({
              scrolls: window.__documentScrolls,
              scrollY: window.scrollY,
              overflow: document.documentElement.scrollHeight - window.innerHeight,
            })"""
        )
    )


@pytest.mark.parametrize("viewport", [DESKTOP, TALL_PHONE], ids=["desktop", "phone"])
async def test_opening_an_approval_from_the_inbox_never_scrolls_the_document(
    browser: Any, quick_gateway: GatewayProcess, page_errors: PageErrors, viewport: dict[str, int]
) -> None:
    from playwright.async_api import expect

    # A thread much taller than the screen, with an approval waiting at its end.
    carol = await Client.connect(quick_gateway.ws_url, token("carol"))
    try:
        ack = await carol.request("run.start", input="tell me a story")
        await carol.wait_event("run.completed")
        await carol.request("run.input", thread_id=ack["thread_id"], input="another story")
        await carol.wait_for(
            lambda f: f.get("event") == "run.completed" and f.get("run_id") != ack["run_id"],
            timeout=30,
        )
        await carol.request("run.input", thread_id=ack["thread_id"], input="refund order 5 for 12")
        await carol.wait_event("approval.requested")
    finally:
        await carol.close()

    page = await reviewer_page(browser, quick_gateway, page_errors, viewport)
    if viewport is TALL_PHONE:
        await page.get_by_test_id("menu").click()
    item = page.get_by_test_id("inbox-item")
    await expect(item).to_have_count(1)
    await item.click()
    card = page.get_by_test_id("approval-card")
    await expect(card).to_be_in_viewport()
    await expect(card.get_by_test_id("approve-button")).to_be_visible()
    # The card is brought into view by scrolling the log (smoothly), not the document.
    log_scrolled = await page.evaluate("document.getElementById('log').scrollTop")
    assert log_scrolled > 0
    await page.wait_for_timeout(800)
    seen = await document_scroll(page)
    assert seen["scrollY"] == 0 and not seen["scrolls"], f"the document scrolled: {seen}"
    assert seen["overflow"] <= 0, f"the document is {seen['overflow']} px taller than the window"
    await expect(page.get_by_test_id("chat-title")).to_be_in_viewport(ratio=1)
    chat = await page.locator("main.chat").bounding_box()
    assert chat and chat["y"] == 0 and chat["y"] + chat["height"] <= viewport["height"]
    if viewport is TALL_PHONE:
        await expect(page.get_by_test_id("menu")).to_be_in_viewport(ratio=1)
    await shot(page, f"inbox-approval-{viewport['width']}")


async def test_a_reviewer_on_a_phone_is_told_approvals_wait(
    browser: Any, quick_gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    page = await reviewer_page(browser, quick_gateway, page_errors, TALL_PHONE)
    menu, badge = page.get_by_test_id("menu"), page.get_by_test_id("menu-count")
    await expect(page.get_by_test_id("inbox")).not_to_be_in_viewport()  # in the closed drawer
    await expect(badge).to_be_hidden()
    carol = await Client.connect(quick_gateway.ws_url, token("carol"))
    try:
        for order in (5, 6):
            await carol.request("run.start", input=f"refund order {order} for 12 dollars")
        await expect(badge).to_have_text("2")
        await expect(badge).to_be_in_viewport(ratio=1)
        await expect(menu).to_have_attribute(
            "aria-label", "Show conversations (2 approvals waiting)"
        )
        await expect(page).to_have_title(re.compile(r"^\(2\) "))
        await shot(page, "phone-approvals-waiting")

        await menu.click()
        await page.get_by_test_id("inbox-item").first.click()
        await page.get_by_test_id("approve-button").click()
        await expect(badge).to_have_text("1")
        await expect(page).to_have_title(re.compile(r"^\(1\) "))
        await expect(menu).to_have_attribute(
            "aria-label", "Show conversations (1 approval waiting)"
        )
        await menu.click()
        await page.get_by_test_id("inbox-item").first.click()
        await page.get_by_test_id("approve-button").click()
        await expect(badge).to_be_hidden()
        await expect(page).not_to_have_title(re.compile(r"^\("))
        await expect(menu).to_have_attribute("aria-label", "Show conversations")
    finally:
        await carol.close()


async def test_a_reviewer_is_offered_nothing_they_cannot_do(
    browser: Any, quick_gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    page = await reviewer_page(browser, quick_gateway, page_errors, DESKTOP)
    # A reviewer cannot start runs: no suggestions to click, no "New chat" that does nothing.
    await expect(page.get_by_test_id("empty-follow")).to_be_visible()
    await expect(page.get_by_test_id("suggestions")).to_be_hidden()
    await expect(page.get_by_test_id("new-chat")).to_be_hidden()
    await expect(page.get_by_test_id("composer-note")).to_be_visible()
    await shot(page, "reviewer-empty")
    await page.set_viewport_size(TALL_PHONE)
    await expect(page.get_by_test_id("empty-follow")).to_be_in_viewport()
    await page.wait_for_timeout(400)  # the drawer slides out of view as the width shrinks
    await shot(page, "reviewer-empty-phone")

    # A user who can start runs still gets both.
    context = await browser.new_context(viewport=DESKTOP)
    alice = await context.new_page()
    page_errors.attach(alice, "alice")
    await alice.goto(f"http://127.0.0.1:{quick_gateway.port}/#token={token('alice')}")
    await expect(alice.get_by_test_id("suggestions").locator("button")).to_have_count(4)
    await expect(alice.get_by_test_id("new-chat")).to_be_visible()
    await expect(alice.get_by_test_id("empty-follow")).to_be_hidden()
