"""The browser client keeps its session alive across token expiry (docs/protocol.md §3).

Gateways here have no leeway (GATEWAY_JWT_LEEWAY_S=0): a socket whose token is not renewed is
closed right at `exp`. Tokens live 8 s, so each test passes at least one expiry. Whether the
socket survived is read from the page's own counters: `sockets` (WebSockets opened) and
`connects` (welcomes to a first hello) stay at 1 through a renewal, while `renewals` (welcomes
to a renewing hello on the open socket) grows.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from client_demo.terminal import token_times
from gateway.auth.access import TokenVerifier
from tests.support.browser import DESKTOP, PageErrors, artifact, wait_until
from tests.support.gateway import TEST_SECRET, GatewayProcess, spawn_gateway

TIMEOUT_MS = 30_000
SHORT_TTL_S = 8
NO_LEEWAY = {"GATEWAY_JWT_LEEWAY_S": "0", "GATEWAY_DEMO_DELAY_MS": "15"}
ASSISTANT_TEXT = "[data-role=assistant] [data-testid=message-text]"
VERIFIER = TokenVerifier(TEST_SECRET)


@pytest.fixture(autouse=True)
def _expect_timeout() -> None:
    from playwright.async_api import expect

    expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture
def dev_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    """Development mode: the page gets its tokens from POST /v1/dev/token."""
    process = spawn_gateway(tmp_path, env={**NO_LEEWAY, "GATEWAY_SECRET": ""})
    try:
        yield process
    finally:
        process.terminate()


@pytest.fixture
def secret_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    """GATEWAY_SECRET set: no development tokens, the user supplies them."""
    process = spawn_gateway(tmp_path, env=NO_LEEWAY)
    try:
        yield process
    finally:
        process.terminate()


async def send(page: Any, text: str) -> None:
    box = page.get_by_test_id("composer-input")
    await box.fill(text)
    await box.press("Enter")


async def connection_stats(page: Any) -> dict[str, int]:
    return dict((await page.evaluate("window.__gateway.stats()"))["connection"])


async def token_info(page: Any) -> dict[str, Any]:
    info = await page.evaluate("window.__gateway.token()")
    assert info, "no session"
    return dict(info)


async def wait_past(page: Any, at_ms: float, margin_ms: float = 1500) -> None:
    """Until the page's clock is `margin_ms` past `at_ms` (a token's expiry)."""
    await wait_until(
        lambda: page.evaluate(f"Date.now() > {at_ms + margin_ms}"), timeout=60, interval=0.2
    )


async def stored_texts(gateway: GatewayProcess, thread_id: str, token: str) -> list[str]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
        response = await http.get(
            f"/v1/threads/{thread_id}/events",
            params={"limit": 1000},
            headers={"Authorization": f"Bearer {token}"},
        )
    response.raise_for_status()
    events = response.json()["events"]
    return [e["data"]["text"] for e in events if e["event"] == "message.completed"]


async def test_development_token_is_renewed_on_the_open_socket(
    browser: Any, dev_gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    page_errors.attach(page, "erin")
    await page.goto(f"http://127.0.0.1:{dev_gateway.port}/")
    await page.get_by_test_id("dev-user").fill("erin")
    await page.get_by_test_id("dev-ttl").fill(str(SHORT_TTL_S))
    await page.get_by_test_id("dev-submit").click()
    conn = page.get_by_test_id("connection")
    await expect(conn).to_have_attribute("data-state", "online")
    first = await token_info(page)
    first_token = await page.evaluate("sessionStorage.getItem('gw.token')")
    assert first["kind"] == "dev" and first["renewals"] == 0, first
    assert first["expiresAt"] - time.time() * 1000 <= SHORT_TTL_S * 1000

    # A thread to keep: its subscription must survive the renewals untouched.
    await send(page, "hello before the expiry")
    await expect(page.locator(ASSISTANT_TEXT).first).to_have_text(
        'You said: "hello before the expiry"'
    )
    thread_id = await page.evaluate("window.__gateway.currentThreadId()")
    assert thread_id

    # Past the first token's expiry: the gateway would have closed the socket by now.
    await wait_past(page, first["expiresAt"])
    await expect(conn).to_have_attribute("data-state", "online")
    counters = await connection_stats(page)
    assert counters["renewals"] >= 1, counters
    assert (counters["sockets"], counters["connects"], counters["reconnects"]) == (1, 1, 0)
    assert int(await conn.get_attribute("data-sockets") or 0) == 1
    renewed = await token_info(page)
    assert renewed["expiresAt"] > first["expiresAt"] and renewed["failures"] == 0, renewed
    # The page keeps the fresh token for reloads and reconnects.
    assert await page.evaluate("sessionStorage.getItem('gw.token')") != first_token

    # A run started after the expiry streams on the same socket, through more renewals.
    await send(page, "tell me a story about a clock")
    badge = page.get_by_test_id("status-badge")
    await expect(badge).to_have_attribute("data-status", "running")
    await expect(badge).to_have_attribute("data-status", "completed", timeout=60_000)
    story = page.locator(ASSISTANT_TEXT).nth(1)
    current = await page.evaluate("sessionStorage.getItem('gw.token')")
    texts = await stored_texts(dev_gateway, thread_id, current)
    assert len(texts) == 2 and len(texts[1].split()) >= 200
    assert (await story.text_content()) == texts[1]
    counters = await connection_stats(page)
    assert (counters["sockets"], counters["connects"], counters["reconnects"]) == (1, 1, 0)
    assert counters["renewals"] >= 2, counters
    assert (await page.evaluate("window.__gateway.stats()"))["deltaMismatches"] == 0
    await expect(page.get_by_test_id("token-renewal")).to_be_hidden()
    await expect(page.get_by_test_id("toast")).to_be_hidden()

    # A reconnect now says hello with the fresh token: one new socket, accepted at once (the
    # first token would be refused, costing a refused socket before a new token).
    await page.evaluate("window.__gateway.dropConnection()")
    await expect(conn).to_have_attribute("data-state", "online")
    counters = await connection_stats(page)
    assert (counters["sockets"], counters["connects"], counters["reconnects"]) == (2, 2, 1)
    await page.screenshot(path=str(artifact("token-renewal-dev.png")))


async def test_supplied_token_asks_for_a_new_one_and_survives_expiry(
    browser: Any, secret_gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    from playwright.async_api import expect

    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    page_errors.attach(page, "dave")
    short = VERIFIER.issue("dave", "acme", ["user"], ttl_s=SHORT_TTL_S)
    await page.goto(f"http://127.0.0.1:{secret_gateway.port}/#token={short}")
    conn = page.get_by_test_id("connection")
    await expect(conn).to_have_attribute("data-state", "online")
    first = await token_info(page)
    assert first["kind"] == "supplied", first
    await send(page, "hello before the expiry")
    await expect(page.locator(ASSISTANT_TEXT).first).to_have_text(
        'You said: "hello before the expiry"'
    )

    # Before the token expires, the page asks for a new one.
    banner = page.get_by_test_id("token-renewal")
    await expect(banner).to_be_visible()
    await expect(banner).to_have_attribute("data-state", "due")
    await expect(page.get_by_test_id("token-renewal-title")).to_have_text(
        "Your access token expires soon."
    )
    await expect(page.get_by_test_id("token-renewal-detail")).to_contain_text(
        re.compile(r"It expires in \d+ s\. Paste a new token for dave")
    )
    await page.screenshot(path=str(artifact("token-renewal-due.png")))
    # Another user's token is refused by the page, before it could end the session.
    await page.get_by_test_id("renewal-input").fill(VERIFIER.issue("mallory", "acme", ["user"]))
    await page.get_by_test_id("renewal-submit").click()
    await expect(page.get_by_test_id("renewal-error")).to_contain_text("sign out to switch users")
    await expect(conn).to_have_attribute("data-state", "online")

    # Pasted in time, a token for the same user renews the open socket.
    second = VERIFIER.issue("dave", "acme", ["user"], ttl_s=SHORT_TTL_S)
    await page.get_by_test_id("renewal-input").fill(second)
    await page.get_by_test_id("renewal-submit").click()
    await expect(banner).to_be_hidden()
    await wait_past(page, first["expiresAt"])
    await expect(conn).to_have_attribute("data-state", "online")
    counters = await connection_stats(page)
    assert (counters["sockets"], counters["connects"], counters["renewals"]) == (1, 1, 1)
    await send(page, "hello after the first expiry")
    await expect(page.locator(ASSISTANT_TEXT).nth(1)).to_have_text(
        'You said: "hello after the first expiry"'
    )

    # Not renewed, the second token expires: the gateway closes the socket, and the page
    # asks for a token without signing out or forgetting the conversation.
    await expect(banner).to_have_attribute("data-state", "expired", timeout=60_000)
    await expect(page.get_by_test_id("token-renewal-title")).to_have_text(
        "Your access token has expired."
    )
    await expect(conn).to_have_attribute("data-state", "offline")
    await expect(conn).to_have_text("Token expired")
    await expect(page.get_by_test_id("signin")).to_be_hidden()
    await expect(page.locator(ASSISTANT_TEXT)).to_have_count(2)
    await page.screenshot(path=str(artifact("token-renewal-expired.png")))

    # A fresh token reconnects, and the thread resumes from its cursor.
    await page.get_by_test_id("renewal-input").fill(VERIFIER.issue("dave", "acme", ["user"]))
    await page.get_by_test_id("renewal-submit").click()
    await expect(banner).to_be_hidden()
    await expect(conn).to_have_attribute("data-state", "online")
    counters = await connection_stats(page)
    assert (counters["sockets"], counters["connects"]) == (2, 2), counters
    await send(page, "hello after reconnecting")
    await expect(page.locator(ASSISTANT_TEXT)).to_have_count(3)
    await expect(page.locator(ASSISTANT_TEXT).nth(2)).to_have_text(
        'You said: "hello after reconnecting"'
    )
    await expect(page.locator("[data-role=user]")).to_have_count(3)


TIMES = """async (tokens) => {
  const { tokenTimes } = await import("/js/renewal.js");
  return tokens.map(([token, receivedAt]) => tokenTimes(token, receivedAt));
}"""


KEEPER_STATE = """async (token) => {
  const { TokenKeeper } = await import("/js/renewal.js");
  const keeper = new TokenKeeper({ token, kind: "supplied", apply: async () => null });
  await new Promise((resolve) => setTimeout(resolve, 300));
  keeper.stop();
  return keeper.state;
}"""


def jwt_like(claims: dict[str, Any]) -> str:
    """A token shaped like a JWT; the page never checks the signature, the gateway does."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2ln"


async def test_renewal_times_match_the_terminal_client(
    browser: Any, secret_gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    """The page renews when the terminal client does (tests/unit/test_renewal_timing.py)."""
    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    page_errors.attach(page, "times")
    await page.goto(f"http://127.0.0.1:{secret_gateway.port}/")
    cases = [
        (jwt_like({"iat": 1000, "exp": 4600}), 1000.0),  # long: at 80 %
        (jwt_like({"iat": 1000, "exp": 1008}), 1000.0),  # short: 3 s before exp
        (jwt_like({"iat": 1000, "exp": 1060}), 900.0),  # local clock behind
        (jwt_like({"iat": 1000, "exp": 1060}), 1100.0),  # local clock ahead
        (jwt_like({"exp": 1100}), 1000.0),  # no iat
        (jwt_like({"iat": 1000}), 1000.0),  # no exp
        ("not-a-token", 1000.0),
    ]
    got = await page.evaluate(TIMES, [[token, at * 1000] for token, at in cases])
    for (token, at), in_page in zip(cases, got, strict=True):
        times = token_times(token, at)
        if times is None:
            assert in_page is None, token
        else:
            want = {"expiresAt": times.expires_at * 1000, "renewAt": times.renew_at * 1000}
            assert in_page == pytest.approx(want), token

    # A token valid for weeks is not due yet. Browsers wrap timer delays to 32 signed bits:
    # one of 32 days (80 % of 40) would come out negative and fire at once, asking the user
    # for a new token right away.
    now = int(time.time())
    weeks = jwt_like({"sub": "dave", "tenant": "acme", "iat": now, "exp": now + 40 * 86400})
    assert await page.evaluate(KEEPER_STATE, weeks) == "fresh"
    soon = jwt_like({"sub": "dave", "tenant": "acme", "iat": now - 100, "exp": now + 2})
    assert await page.evaluate(KEEPER_STATE, soon) == "due"
