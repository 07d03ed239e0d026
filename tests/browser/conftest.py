"""Fixtures for browser tests: a real gateway subprocess and headless Chromium."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import CHROMIUM_ARGS, PageErrors, chromium_path, unavailable
from tests.support.gateway import GatewayProcess, spawn_gateway

# Streams slowly enough to cut a connection (or reload) in the middle of a story.
DEMO_DELAY_MS = "25"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = spawn_gateway(tmp_path, env={"GATEWAY_DEMO_DELAY_MS": DEMO_DELAY_MS})
    try:
        yield process
    finally:
        process.terminate()


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        unavailable("the playwright module is not installed (pip install playwright)")
    executable = chromium_path()
    if executable is None:
        unavailable("no Chromium found (apt-get install chromium, or set CHROMIUM_PATH)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
def page_errors() -> Iterator[PageErrors]:
    errors = PageErrors()
    yield errors
    assert not errors.errors, "uncaught errors in the page:\n" + "\n".join(errors.errors)
