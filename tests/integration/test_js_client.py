"""The JavaScript client package (client_demo/js) under Node's test runner.

Each Node test file starts its own real gateway (this interpreter's `python -m gateway serve
--port 0`) and drives it over real WebSockets: approvals, a connection cut mid-story and
resumed exactly, an epoch reset, token renewal, the React hook, and the generated TypeScript
declarations against docs/asyncapi.json. Without Node or the package's dev dependencies
(`npm ci` in client_demo/js) the tests skip, or fail under GATEWAY_REQUIRE_SERVICES=1 (CI).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REQUIRE_SERVICES
from tests.support.gateway import ROOT

PACKAGE = ROOT / "client_demo" / "js"
TEST_FILES = sorted(path.name for path in (PACKAGE / "test").glob("*.test.js"))
MIN_NODE = 18  # the first with `node --test`


def node_or_skip() -> str:
    """The `node` binary, or a skip (a failure under GATEWAY_REQUIRE_SERVICES=1) saying why."""
    node = shutil.which("node")
    reason = None
    if node is None:
        reason = "Node.js is not installed (the JavaScript client's tests need node >= 18)"
    else:
        found = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
        match = re.match(r"v(\d+)\.", found.stdout.strip())
        if not match or int(match.group(1)) < MIN_NODE:
            reason = f"Node.js {found.stdout.strip() or '?'} is too old (need >= {MIN_NODE})"
        elif not (PACKAGE / "node_modules" / "ws").is_dir():
            reason = (
                "the JavaScript client's dev dependencies are missing: "
                "run `npm ci` in client_demo/js"
            )
    if reason is not None:
        if REQUIRE_SERVICES:
            pytest.fail(reason + " (GATEWAY_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    assert node is not None
    return node


def test_the_package_has_node_tests() -> None:
    assert {
        "client.test.js",
        "connection.test.js",
        "docs.test.js",
        "pack.test.js",
        "react.test.js",
        "reset.test.js",
        "types.test.js",
        "unit.test.js",
    } <= set(TEST_FILES)


@pytest.mark.parametrize("test_file", TEST_FILES)
def test_js_client(test_file: str) -> None:
    node = node_or_skip()
    env = {**os.environ, "GATEWAY_PYTHON": sys.executable}
    env.pop("GATEWAY_SECRET", None)
    # The timeout only guards against a hang; the tests themselves wait on events.
    result = subprocess.run(
        [node, "--test", "--test-reporter=spec", f"test/{test_file}"],
        cwd=PACKAGE,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, (
        f"node --test {test_file} failed:\n{result.stdout}\n{result.stderr}"
    )
    assert re.search(r"\bpass [1-9]", result.stdout), result.stdout
    assert re.search(r"\bfail 0\b", result.stdout), result.stdout
