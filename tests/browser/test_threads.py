"""Threads as people see them in the browser demo: a link per thread that reopens it, a live
list with titles and waiting approvals, renaming, archiving and deleting, and a reviewer's
inbox that names each approval's thread and the message it answers."""

from __future__ import annotations

import re
from typing import Any

from tests.browser.test_chat import TIMEOUT_MS, open_chat, send, shot, token
from tests.support.browser import PHONE, PageErrors, wait_until
from tests.support.client import Client
from tests.support.gateway import GatewayProcess

LINK = re.compile(r"#/t/(t_[0-9a-f]+)$")


async def linked_thread(page: Any) -> str:
    match = await wait_until(lambda: _link(page))
    return str(match.group(1))


async def _link(page: Any) -> Any:
    return LINK.search(page.url)


async def test_a_thread_has_a_link_that_reopens_it(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    context, alice = await open_chat(browser, gateway, page_errors, "alice")
    await send(alice, "what is the status of orders 3 and 8?")
    first = await linked_thread(alice)
    await expect(alice.get_by_test_id("chat-title")).to_have_text(
        "what is the status of orders 3 and 8?"
    )
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute(
        "data-status", "completed", timeout=TIMEOUT_MS
    )
    link = alice.url

    # A second conversation gets its own address; Back returns to the first.
    await alice.get_by_test_id("new-chat").click()
    assert LINK.search(alice.url) is None
    await send(alice, "tell me a story")
    second = await linked_thread(alice)
    assert second != first
    await alice.go_back()
    await expect(alice.get_by_test_id("chat-title")).to_have_text(
        "what is the status of orders 3 and 8?"
    )
    assert await alice.evaluate("window.__gateway.currentThreadId()") == first

    # The link, opened where nobody is signed in yet, leads there after signing in.
    stranger = await browser.new_context()
    page = await stranger.new_page()
    page_errors.attach(page, "alice elsewhere")
    await page.goto(link)
    await expect(page.get_by_test_id("signin")).to_be_visible()
    await page.get_by_test_id("token-input").fill(token("alice"))
    await page.get_by_test_id("token-submit").click()
    await expect(page.get_by_test_id("chat-title")).to_have_text(
        "what is the status of orders 3 and 8?"
    )
    await expect(page.locator("[data-role=assistant]").first).to_be_visible()
    assert page.url == link
    # A link to a thread that is not there says so and leaves a new chat.
    await page.goto("about:blank")
    await page.goto(link.replace(first, "t_0000deadbeef"))
    await expect(page.get_by_test_id("toast")).to_contain_text("Cannot open that conversation")
    await expect(page.get_by_test_id("chat-title")).to_have_text("New chat")
    await stranger.close()
    await context.close()
    assert not page_errors.errors


async def test_the_list_is_live_and_a_thread_is_renamed_archived_and_deleted(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice")
    # A run started elsewhere (alice's other device) appears in the list without a reload,
    # with its title and the approval it waits for.
    other = await Client.connect(f"ws://127.0.0.1:{gateway.port}/v1/ws", token("alice"))
    try:
        ack = await other.request("run.start", input="refund order 42 for 30 dollars")
        thread_id = ack["thread_id"]
        item = alice.locator(f'[data-testid=thread-item][data-thread-id="{thread_id}"]')
        await expect(item).to_contain_text("refund order 42 for 30 dollars")
        await expect(item.get_by_test_id("thread-waiting")).to_have_text("1 approval waiting")
        await shot(alice, "thread-list-live")
    finally:
        await other.close()

    await item.click()
    assert (await linked_thread(alice)) == thread_id
    alice.once("dialog", lambda dialog: dialog.accept("Ann's refund"))
    await alice.get_by_test_id("thread-actions").click()
    await expect(alice.get_by_test_id("thread-menu")).to_be_visible()
    await shot(alice, "thread-menu")
    await alice.get_by_test_id("rename-thread").click()
    await expect(alice.get_by_test_id("chat-title")).to_have_text("Ann's refund")
    await expect(item.locator(".thread-title")).to_have_text("Ann's refund")

    # A thread whose run waits for a decision cannot be deleted: the page says what to do.
    alice.once("dialog", lambda dialog: dialog.accept())
    await alice.get_by_test_id("thread-actions").click()
    await alice.get_by_test_id("delete-thread").click()
    await expect(alice.get_by_test_id("toast")).to_contain_text("before deleting")

    await alice.get_by_test_id("thread-actions").click()
    await alice.get_by_test_id("archive-thread").click()
    await expect(item).to_have_count(0)
    await expect(alice.get_by_test_id("chat-title")).to_have_text("New chat")
    await alice.get_by_test_id("show-archived").click()
    await item.click()
    await alice.get_by_test_id("thread-actions").click()
    await expect(alice.get_by_test_id("archive-thread")).to_have_text("Unarchive")
    await alice.get_by_test_id("archive-thread").click()
    await expect(item).to_have_count(0)
    await alice.get_by_test_id("show-archived").click()
    await expect(item).to_be_visible()

    # Cancelled, it can go; the list and the address forget it.
    await alice.get_by_test_id("cancel-run").click()
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute("data-status", "cancelled")
    alice.once("dialog", lambda dialog: dialog.accept())
    await alice.get_by_test_id("thread-actions").click()
    await alice.get_by_test_id("delete-thread").click()
    await expect(item).to_have_count(0)
    await expect(alice.get_by_test_id("chat-title")).to_have_text("New chat")
    assert LINK.search(alice.url) is None
    assert not page_errors.errors


async def test_the_inbox_names_the_thread_and_the_message_each_approval_answers(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    # A reviewer signed in first, on a phone: the threads are all created after that.
    _, bob = await open_chat(browser, gateway, page_errors, "bob", "reviewer", viewport=PHONE)
    carol = await Client.connect(f"ws://127.0.0.1:{gateway.port}/v1/ws", token("carol"))
    try:
        ack = await carol.request("run.start", input="what is the status of order 3?")
        await carol.wait_event("run.completed")
        await carol.request("run.input", thread_id=ack["thread_id"], input="refund order 3 for 9")
        await bob.get_by_test_id("menu").click()
        entry = bob.get_by_test_id("inbox-item")
        await expect(entry).to_have_count(1)
        await expect(entry.get_by_test_id("inbox-thread")).to_have_text(
            "what is the status of order 3?"
        )
        await expect(entry.get_by_test_id("inbox-asked")).to_have_text("“refund order 3 for 9”")
        await shot(bob, "inbox-titles-phone")
    finally:
        await carol.close()
    assert not page_errors.errors
