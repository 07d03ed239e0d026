"""Headless Chromium for browser tests (Playwright for Python, async API).

Chromium comes from the system (Debian's `chromium` package, or `CHROMIUM_PATH`): Playwright's
own browser download is never used. Without Chromium or the `playwright` module the browser tests
skip with a message, except under CI (`CI` set), where that is a failure.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway import ROOT

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 780}


def unavailable(message: str) -> None:
    """Skip locally; fail under CI, where a missing browser must not pass silently."""
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so this is a failure)")
    pytest.skip(message)


def chromium_path() -> str | None:
    configured = os.environ.get("CHROMIUM_PATH")
    if configured:
        return configured if Path(configured).exists() else None
    for candidate in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageErrors:
    """Uncaught exceptions in a page: every browser test asserts there were none."""

    errors: list[str] = field(default_factory=list)

    def attach(self, page: Any, label: str) -> None:
        page.on("pageerror", lambda exc: self.errors.append(f"{label}: {exc}"))


async def wait_until(
    probe: Callable[[], Awaitable[Any]], *, timeout: float = 20, interval: float = 0.05
) -> Any:
    """Poll `probe` until it returns something truthy (CSP forbids wait_for_function's eval)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s (last value {value!r})")
        await asyncio.sleep(interval)


def artifact(name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name
