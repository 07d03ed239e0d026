"""The browser's own word on the network: the page shows it offline as soon as the browser
says so, and back online as soon as it returns (the client package's `offline` and `online`
handling, client_demo/js/src/connection.js)."""

from __future__ import annotations

import time
from typing import Any

from tests.browser.test_chat import open_chat, send, stats
from tests.support.browser import PageErrors
from tests.support.gateway import GatewayProcess


async def test_the_page_is_offline_as_soon_as_the_browser_is(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    context, alice = await open_chat(browser, gateway, page_errors, "alice", "user")
    connection = alice.get_by_test_id("connection")
    sockets = (await stats(alice))["connection"]["sockets"]
    # The socket itself stays up under Chromium's offline emulation: only the browser's
    # `offline` event says the network is gone. Heartbeats alone took 40-50 s to notice.
    started = time.monotonic()
    await context.set_offline(True)
    await expect(connection).to_have_attribute("data-state", "offline", timeout=5_000)
    assert time.monotonic() - started < 5
    await context.set_offline(False)
    await expect(connection).to_have_attribute("data-state", "online", timeout=5_000)
    assert (await stats(alice))["connection"]["sockets"] > sockets
    await send(alice, "hello again")
    await expect(alice.locator("[data-role=assistant] [data-testid=message-text]")).to_have_text(
        'You said: "hello again"'
    )
