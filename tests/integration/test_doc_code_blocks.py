"""Every Python code block of the README and docs/ runs, as written.

Each block is run by a test: here, or where `COVERED` says. A block added to the docs without a
test makes `test_every_python_block_is_run_by_a_test` fail. (The JavaScript examples of
docs/frontend.md are run by client_demo/js/test/docs.test.js.)
"""

from __future__ import annotations

import hashlib
import hmac
import re
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.agents.run_caller import RunCaller
from tests.support.gateway import ROOT, GatewayProcess, spawn_gateway

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# Pages are named `DOCS + "page.md"`: the docs reference checker takes "docs/page.md" followed
# by a quoted string for a reference to one of its headings.
DOCS = "docs/"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# (page, index of the Python block on that page): the test that runs it.
COVERED = {
    ("README.md", 0): "tests/unit/test_readme_example.py",
    **{
        (DOCS + "agents.md", index): "test_the_agents_guide_blocks_run_in_order"
        for index in range(9)
    },
    (DOCS + "clients.md", 0): "test_the_protocol_by_hand_script_prints_what_the_page_shows",
    (DOCS + "protocol.md", 0): "test_the_webhook_signature_check_accepts_only_signed_bodies",
}


def blocks(page: str, language: str = "python") -> list[str]:
    text = (ROOT / page).read_text()
    return [body for lang, body in BLOCK.findall(text) if lang == language]


def test_every_python_block_is_run_by_a_test() -> None:
    found = {
        (str(page.relative_to(ROOT)), index)
        for page in PAGES
        for index, _ in enumerate(blocks(str(page.relative_to(ROOT))))
    }
    assert found - COVERED.keys() == set(), "Python blocks of the docs that no test runs"
    assert COVERED.keys() - found == set(), "COVERED names blocks the docs no longer have"


def test_the_agents_guide_blocks_run_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/agents.md builds one example up block by block: run them in one module, with the
    payment provider's client of the last block standing in for the reader's own."""
    created: list[tuple[int, float, str]] = []

    async def create(order_id: int, amount: float, *, idempotency_key: str) -> str:
        created.append((order_id, amount, idempotency_key))
        return f"refunded {amount} for {order_id}"

    payments = types.ModuleType("payments")
    payments.refunds = types.SimpleNamespace(create=create)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "payments", payments)
    module = types.ModuleType("agents_guide")
    # Where dataclasses look their module up.
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for index, source in enumerate(blocks(DOCS + "agents.md")):
        exec(compile(source, f"docs/agents.md block {index}", "exec"), module.__dict__)
    registry = module.registry
    assert registry.names() == ["support"]
    agent = registry.get("support").build()
    assert [tool.name for tool in agent.tools] == ["lookup_invoice", "cancel_subscription"]
    assert module.issue_refund.needs_approval is True
    # The rule that decides by itself ("Access and masking"); the graphs there are built
    # as the blocks run, so a wrong `decided_by` would have raised.
    rule = module.small_refunds_by_support
    support = RunCaller("sam", "acme", frozenset({"support"}), {}, "t_1", "r_1", "support")
    assert rule({"order_id": 1, "amount": 50}, support) == "approve"
    assert rule({"order_id": 1, "amount": 51}, support) is None
    assert rule({"order_id": 1, "amount": 5}, replace(support, roles=frozenset())) is None


def test_the_webhook_signature_check_accepts_only_signed_bodies() -> None:
    [source] = blocks(DOCS + "protocol.md")
    namespace: dict[str, Any] = {}
    exec(compile(source, DOCS + "protocol.md", "exec"), namespace)
    verified = namespace["verified"]
    secret, body, timestamp = "s" * 32, b'{"type":"approval.requested"}', str(int(time.time()))
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    headers = {"Webhook-Timestamp": timestamp, "Webhook-Signature": f"v1=bad v1={mac.hexdigest()}"}
    assert verified(secret, headers, body)
    assert not verified(secret, headers, body + b" ")
    assert not verified(secret, {**headers, "Webhook-Timestamp": str(int(time.time()) - 600)}, body)


@pytest.fixture
def dev_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    # As `python3 dev.py serve` runs it: development mode, the demo model's usual pace.
    process = spawn_gateway(tmp_path, env={"GATEWAY_SECRET": "", "GATEWAY_DEMO_DELAY_MS": "5"})
    try:
        yield process
    finally:
        process.terminate()


def test_the_protocol_by_hand_script_prints_what_the_page_shows(
    dev_gateway: GatewayProcess, tmp_path: Path
) -> None:
    [script] = blocks(DOCS + "clients.md")
    output = next(body for body in blocks(DOCS + "clients.md", "") if "[bob approves" in body)
    assert script.count("127.0.0.1:8000") == 2
    path = tmp_path / "by_hand.py"
    path.write_text(script.replace("127.0.0.1:8000", f"127.0.0.1:{dev_gateway.port}"))
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == output
