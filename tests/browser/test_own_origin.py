"""A frontend on its own origin (docs/frontend.md "A frontend on its own origin"), in real
Chromium: a page served elsewhere calls the HTTP API, reads an SSE feed and chats over the
WebSocket, all allowed by GATEWAY_ALLOWED_ORIGINS (CORS for HTTP, the Origin check for the
WebSocket)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.browser.test_chat import token
from tests.support.browser import DESKTOP, PageErrors, wait_until
from tests.support.gateway import ROOT, spawn_gateway

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>my app</title>
<link rel="icon" href="data:,">
<script type="module">
import { GatewayClient } from "./src/index.js";

const params = new URLSearchParams(location.hash.slice(1));
const gateway = params.get("gateway");
const auth = { authorization: `Bearer ${params.get("token")}` };
const result = {};
try {
  const url = gateway.replace("http", "ws") + "/v1/ws";
  const client = new GatewayClient({ url, token: params.get("token") });
  client.connect();
  const { threadId } = await client.startRun({ input: "hello from my app" });
  const completed = new Promise((resolve) =>
    client.on(`thread:${threadId}`, (state) => state.status === "completed" && resolve(state)));
  result.answer = (await completed).runs[(await completed).runId].finalOutput;
  const listed = await (await fetch(`${gateway}/v1/threads`, { headers: auth })).json();
  result.threads = listed.threads.map((thread) => thread.thread_id).includes(threadId);
  const stream = `${gateway}/v1/threads/${threadId}/stream?after_seq=0`;
  const feed = await fetch(stream, { headers: auth });
  const reader = feed.body.getReader();
  result.feed = new TextDecoder().decode((await reader.read()).value);
  await reader.cancel();
  client.close();
} catch (error) {
  result.error = String(error);
}
window.__result = result;
</script>
"""


class _Files(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def app_server(tmp_path: Path) -> Iterator[str]:
    """The app's own origin: its page and the client package's modules, as a bundler would
    serve them."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(PAGE)
    (site / "src").symlink_to(ROOT / "client_demo" / "js" / "src")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Files, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_an_app_on_its_own_origin_uses_the_http_api_and_the_websocket(
    browser: Any, tmp_path: Path, app_server: str, page_errors: PageErrors
) -> None:
    gateway = spawn_gateway(tmp_path, env={"GATEWAY_ALLOWED_ORIGINS": app_server})
    try:
        context = await browser.new_context(viewport=DESKTOP)
        page = await context.new_page()
        page_errors.attach(page, "app")
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        gateway_url = f"http://127.0.0.1:{gateway.port}"
        await page.goto(f"{app_server}/#gateway={gateway_url}&token={token('amy')}")
        result = await wait_until(lambda: page.evaluate("window.__result"), timeout=30)
        assert "error" not in result, (result, problems)
        assert result["answer"] == 'You said: "hello from my app"'
        assert result["threads"] is True
        assert "event: " in result["feed"] or "data: " in result["feed"], result["feed"]
        assert not problems, problems
    finally:
        gateway.terminate()
