"""The guide's HTTP-only reviewer example (client_demo/http_review.py, docs/frontend.md) run as
it is documented, against a real gateway."""

from __future__ import annotations

import asyncio
import sys

from gateway.agents.demo.assistant import refund_text
from tests.support.gateway import ROOT, Gateway


async def test_the_http_review_example_runs_as_documented(gateway: Gateway) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client_demo.http_review",
        "--url",
        gateway.http_url,
        "--user-token",
        gateway.token("alice", "user"),
        "--reviewer-token",
        gateway.token("bob", "reviewer"),
        "refund order 42 for 30",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert refund_text(42, 30) in out.decode()
