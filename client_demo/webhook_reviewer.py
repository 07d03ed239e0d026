"""A reviewer that needs no open connection: it receives the gateway's `approval.requested`
webhooks, checks their signature, and decides over HTTP.

    GATEWAY_WEBHOOK_SECRET=... python -m client_demo.webhook_reviewer \\
        --url http://127.0.0.1:8000 --reviewer-token "$REVIEWER_JWT" --port 8100 \\
        [--approve issue_refund] [--once]

Start the gateway with GATEWAY_WEBHOOK_URL=http://127.0.0.1:8100/webhooks and the same
GATEWAY_WEBHOOK_SECRET (docs/protocol.md §10). Every request whose `Webhook-Signature` does not
verify, or whose `Webhook-Timestamp` is more than five minutes off, is refused with 401; a
`Webhook-Id` already seen (the gateway delivers at least once) is answered 200 and ignored. An
approval of a tool named by `--approve` is approved, any other rejected, with
`POST /v1/approvals/{approval_id}/decision`; the decision is made after the webhook has been
answered, so a slow gateway answer never makes the webhook time out. `--once`: exit after the
first decision. Prints one line per decision.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import sys
import time
from collections import OrderedDict
from typing import Any

import httpx
import uvicorn

# A signed request older (or newer) than this is refused: a replay of a captured one.
MAX_SKEW_S = 300
# Webhook ids remembered for deduplication (the oldest are forgotten first).
REMEMBERED_IDS = 10_000


def verified(secret: str, timestamp: str, body: bytes, header: str) -> bool:
    """The signature check of docs/protocol.md §10."""
    try:
        if abs(time.time() - int(timestamp)) > MAX_SKEW_S:
            return False
    except ValueError:
        return False
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    expected = "v1=" + mac.hexdigest()
    return any(hmac.compare_digest(expected, candidate) for candidate in header.split())


class WebhookReviewer:
    """The receiving ASGI application and the decisions it makes."""

    def __init__(
        self, http: httpx.AsyncClient, secret: str, approve: set[str], *, once: bool
    ) -> None:
        self._http = http
        self._secret = secret
        self._approve = approve
        self._once = once
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._decisions: set[asyncio.Task[None]] = set()
        self.done = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = bool(message.get("more_body"))
        headers = {key.decode().lower(): value.decode() for key, value in scope["headers"]}
        status = self._take(headers, body)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def _take(self, headers: dict[str, str], body: bytes) -> int:
        timestamp = headers.get("webhook-timestamp", "")
        signature = headers.get("webhook-signature", "")
        if not verified(self._secret, timestamp, body, signature):
            return 401
        message_id = headers.get("webhook-id", "")
        if message_id in self._seen:
            return 200
        self._seen[message_id] = None
        if len(self._seen) > REMEMBERED_IDS:
            self._seen.popitem(last=False)
        payload = json.loads(body)
        if payload.get("type") == "approval.requested":
            task = asyncio.create_task(self._decide(payload["data"]))
            self._decisions.add(task)
            task.add_done_callback(self._decisions.discard)
        return 200

    async def _decide(self, approval: dict[str, Any]) -> None:
        tool_name = approval.get("tool_name", "")
        decision = "approve" if tool_name in self._approve else "reject"
        answer = await self._http.post(
            f"/v1/approvals/{approval['approval_id']}/decision",
            json={"decision": decision, "reason": f"{decision}d by the webhook reviewer"},
        )
        # 409: decided meanwhile by someone else (or by this reviewer, for a redelivery).
        if answer.status_code not in (200, 409):
            answer.raise_for_status()
        print(f"{decision} {approval['approval_id']} ({tool_name}): {answer.status_code}")
        sys.stdout.flush()
        if self._once:
            self.done.set()


async def main(url: str, token: str, secret: str, port: int, approve: set[str], once: bool) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http:
        reviewer = WebhookReviewer(http, secret, approve, once=once)
        server = uvicorn.Server(
            uvicorn.Config(reviewer, host="127.0.0.1", port=port, log_level="warning")
        )
        serving = asyncio.create_task(server.serve())
        stopped = asyncio.create_task(reviewer.done.wait())
        await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        await serving


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway")
    parser.add_argument("--reviewer-token", required=True)
    parser.add_argument("--port", type=int, default=8100, help="where webhooks are received")
    parser.add_argument(
        "--approve", action="append", default=None, help="tool to approve (repeatable)"
    )
    parser.add_argument("--once", action="store_true", help="exit after the first decision")
    args = parser.parse_args()
    webhook_secret = os.environ.get("GATEWAY_WEBHOOK_SECRET")
    if not webhook_secret:
        parser.error("set GATEWAY_WEBHOOK_SECRET to the gateway's webhook secret")
    asyncio.run(
        main(
            args.url,
            args.reviewer_token,
            webhook_secret,
            args.port,
            set(args.approve or ["issue_refund"]),
            args.once,
        )
    )
