"""The demo's smaller edges, in real headless Chromium: a sign-in page that loads without a
failed request, controls a finger can hit on a phone, a connection state told in words, a
composer placeholder that fits, and end-user words instead of the protocol's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.test_chat import open_chat, send, shot
from tests.support.browser import DESKTOP, PageErrors
from tests.support.gateway import GatewayProcess, spawn_gateway

PHONE = {"width": 390, "height": 844}
MIN_TARGET_PX = 44
# What the protocol calls things, which a person using the chat should never have to read.
PROTOCOL_WORDS = re.compile(
    r"\b(run|runs|staged|queued|superseded|checkpoint|epoch|cursor|seq)\b", re.IGNORECASE
)


@pytest.fixture
def dev_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    """Development mode: no GATEWAY_SECRET, so the sign-in page offers development tokens."""
    process = spawn_gateway(tmp_path, env={"GATEWAY_SECRET": ""})
    try:
        yield process
    finally:
        process.terminate()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
async def test_the_sign_in_page_loads_without_a_failed_request(
    browser: Any, dev_gateway: GatewayProcess, page_errors: PageErrors, viewport: dict[str, int]
) -> None:
    from playwright.async_api import expect

    context = await browser.new_context(viewport=viewport)
    page = await context.new_page()
    page_errors.attach(page, "sign-in")
    console: list[str] = []
    failed: list[str] = []
    page.on("console", lambda m: m.type == "error" and console.append(m.text))
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    await page.goto(f"http://127.0.0.1:{dev_gateway.port}/")
    # Development mode was found out (the form is offered) without trying to get a token.
    await expect(page.get_by_test_id("dev-signin")).to_be_visible()
    await page.wait_for_load_state("networkidle")
    assert failed == [] and console == [], (failed, console)
    await shot(page, f"signin-{viewport['width']}")
    await context.close()


async def test_every_control_on_a_phone_is_at_least_44_px(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user", viewport=PHONE)
    await expect(alice.get_by_test_id("suggestions").locator("button")).to_have_count(4)
    small = await _small_targets(alice)
    await send(alice, "refund order 42 for 30 dollars")
    await expect(alice.get_by_test_id("approval-card")).to_be_visible()
    small += await _small_targets(alice)
    await alice.get_by_test_id("thread-actions").click()
    small += await _small_targets(alice)
    await alice.keyboard.press("Escape")
    await alice.get_by_test_id("menu").click()
    await expect(alice.get_by_test_id("new-chat")).to_be_in_viewport()
    small += await _small_targets(alice)
    assert small == [], small


async def _small_targets(page: Any) -> list[Any]:
    """Visible controls inside the viewport narrower or lower than a fingertip."""
    return list(
        await page.evaluate(
            """(min) => [...document.querySelectorAll(
                 'button, a[href], input:not([type=hidden]), textarea, select, label:has(input)')]
               .filter((e) => {
                 const r = e.getBoundingClientRect();
                 const style = getComputedStyle(e);
                 return r.width > 0 && r.height > 0 && style.visibility !== 'hidden'
                   && r.right > 0 && r.left < innerWidth && r.bottom > 0 && r.top < innerHeight
                   && !e.closest('[hidden], .sr-only');
               })
               .map((e) => {
                 const r = e.getBoundingClientRect();
                 return [e.id || e.dataset.testid || e.className || e.tagName,
                         Math.round(r.width), Math.round(r.height)];
               })
               .filter(([, w, h]) => Math.min(w, h) < min)""",
            MIN_TARGET_PX,
        )
    )


async def test_the_phone_tells_the_connection_state_in_words(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user", viewport=PHONE)
    connection = alice.get_by_test_id("connection")
    # Not a colour alone: a label shows, and assistive technology reads the state.
    await expect(connection.locator(".conn-label")).to_be_visible()
    await expect(connection).to_have_accessible_name(re.compile("Online"))
    await expect(alice.get_by_role("button", name=re.compile("Connection: Online"))).to_be_visible()
    await shot(alice, "phone-connection")


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
async def test_the_paused_run_placeholder_fits_the_composer(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors, viewport: dict[str, int]
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user", viewport=viewport)
    await send(alice, "refund order 42 for 30 dollars")
    await expect(alice.get_by_test_id("status-badge")).to_have_attribute(
        "data-status", "waiting_for_review"
    )
    box = alice.get_by_test_id("composer-input")
    placeholder = await box.get_attribute("placeholder")
    assert placeholder
    room, needed = await box.evaluate(
        """(el) => {
          const style = getComputedStyle(el);
          const ctx = document.createElement('canvas').getContext('2d');
          ctx.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
          const padding = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
          return [el.clientWidth - padding, ctx.measureText(el.placeholder).width];
        }"""
    )
    assert needed <= room, f"{placeholder!r} needs {needed}px, the box has {room}px"
    await shot(alice, f"paused-{viewport['width']}")


async def test_the_chat_speaks_plain_words_not_the_protocol(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    _, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    # Input sent while an approval waits, input sent while an answer streams, a stop.
    await send(alice, "refund order 42 for 30 dollars")
    await expect(alice.get_by_test_id("approval-card")).to_be_visible()
    await send(alice, "and thank you")
    await _no_protocol_words(alice)
    await alice.get_by_test_id("cancel-run").click()
    await expect(alice.get_by_test_id("notice")).to_contain_text("Stopped.")
    await send(alice, "tell me a story")
    await expect(alice.get_by_test_id("cancel-run")).to_be_visible()
    await send(alice, "and another one")
    await _no_protocol_words(alice)
    await alice.get_by_test_id("cancel-run").click()
    await _no_protocol_words(alice)
    await expect(alice.get_by_test_id("cancel-run")).to_have_text("Stop")


async def _no_protocol_words(page: Any) -> None:
    # What people typed is theirs; everything else on the screen is the page's wording.
    text = await page.evaluate(
        """() => {
          let shown = document.getElementById('app').innerText;
          const typed = document.querySelectorAll(
            '.bubble-text, [data-testid=message-text], .thread-title, #chat-title');
          for (const el of typed) shown = shown.split(el.innerText).join(' ');
          return shown + ' ' + document.getElementById('input').placeholder;
        }"""
    )
    found = PROTOCOL_WORDS.findall(text)
    assert found == [], f"{found} in: {text}"
