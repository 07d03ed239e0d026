"""Node scripts that drive the real frontend libraries (tests/frontends/node, installed from its
committed lockfile by `npm ci`) against a gateway. Without Node or those packages the tests skip
saying why, or fail under GATEWAY_REQUIRE_SERVICES=1 (CI)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REQUIRE_SERVICES
from tests.support.gateway import ROOT

FRONTEND_PACKAGES = ROOT / "tests" / "frontends" / "node"
MIN_NODE = 20


def node_or_skip(package: str = "ai") -> str:
    """The `node` binary, once `package` is installed in tests/frontends/node."""
    node = shutil.which("node")
    reason = None
    if node is None:
        reason = f"Node.js is not installed (the frontend tests need node >= {MIN_NODE})"
    else:
        found = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
        match = re.match(r"v(\d+)\.", found.stdout.strip())
        if not match or int(match.group(1)) < MIN_NODE:
            reason = f"Node.js {found.stdout.strip() or '?'} is too old (need >= {MIN_NODE})"
        elif not (FRONTEND_PACKAGES / "node_modules" / package).is_dir():
            reason = f"{package} is not installed: run `npm ci` in tests/frontends/node"
    if reason is not None:
        if REQUIRE_SERVICES:
            pytest.fail(reason + " (GATEWAY_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    assert node is not None
    return node


class NodeScript:
    """A running script: JSON lines out (`next_event`), JSON lines in (`tell`)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.events: list[dict[str, Any]] = []

    async def next_event(self, timeout_s: float = 30.0) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), timeout_s)
        if not line:
            stderr = b""
            if self._process.stderr is not None:
                stderr = await self._process.stderr.read()
            raise AssertionError(f"the script ended early: {stderr.decode(errors='replace')}")
        event = json.loads(line)
        self.events.append(event)
        return event

    async def until(self, name: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The next event called `name`; a `failed` or `done` on the way is an assertion."""
        while True:
            event = await self.next_event(timeout_s)
            if event["event"] == name:
                return event
            if event["event"] in ("failed", "done"):
                raise AssertionError(f"waiting for {name!r}, the script said {event}")

    def tell(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(message).encode() + b"\n")


@contextlib.asynccontextmanager
async def node_script(
    script: str, config: dict[str, Any], *, package: str = "ai"
) -> AsyncIterator[NodeScript]:
    """Run tests/frontends/node/`script` with `config` as its JSON argument."""
    node = node_or_skip(package)
    process = await asyncio.create_subprocess_exec(
        node,
        str(FRONTEND_PACKAGES / script),
        json.dumps(config),
        cwd=FRONTEND_PACKAGES,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=64 * 1024 * 1024,
    )
    try:
        yield NodeScript(process)
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


def script_path(script: str) -> Path:
    return FRONTEND_PACKAGES / script
