"""Start a run, follow it and decide its approval over plain HTTP: no WebSocket.

    python -m client_demo.http_review --url http://127.0.0.1:8000 \\
        --user-token "$USER_JWT" --reviewer-token "$REVIEWER_JWT" "refund order 42 for 30"

The user starts the run (`POST /v1/runs`) and follows its thread's Server-Sent Events feed; the
reviewer reads the inbox feed (`GET /v1/approvals/stream`) and approves over
`POST /v1/approvals/{approval_id}/decision` (docs/protocol.md §8). Prints the run's last message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx


async def sse(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """(event name, decoded data) of each message; comments (heartbeats) are skipped."""
    event, data = "message", ""
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, json.loads(data)
            event, data = "message", ""
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()


async def review(http: httpx.AsyncClient, token: str, ready: asyncio.Event) -> None:
    """Approve the first approval the inbox feed announces."""
    headers = {"Authorization": f"Bearer {token}"}
    async with http.stream("GET", "/v1/approvals/stream", headers=headers) as response:
        response.raise_for_status()
        async for event, frame in sse(response):
            if event == "inbox":
                ready.set()
            added = frame.get("added", []) if event == "inbox.update" else []
            for approval in added:
                answer = await http.post(
                    f"/v1/approvals/{approval['approval_id']}/decision",
                    json={"decision": "approve", "reason": "checked over HTTP"},
                    headers=headers,
                )
                answer.raise_for_status()
                return


async def main(url: str, user_token: str, reviewer_token: str, text: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(10, read=60)) as http:
        ready = asyncio.Event()
        reviewer = asyncio.create_task(review(http, reviewer_token, ready))
        await ready.wait()  # the reviewer's inbox is open before the run can ask
        headers = {"Authorization": f"Bearer {user_token}"}
        started = await http.post("/v1/runs", json={"input": text}, headers=headers)
        started.raise_for_status()
        run = started.json()
        reply = ""
        async with http.stream(
            "GET",
            f"/v1/threads/{run['thread_id']}/stream",
            params={"after_seq": run["first_seq"] - 1},
            headers=headers,
        ) as response:
            response.raise_for_status()
            async for _message, frame in sse(response):
                name = frame.get("event")
                if name == "message.completed":
                    reply = frame["data"]["text"]
                if name in ("run.completed", "run.failed", "run.cancelled"):
                    break
        await reviewer
        return reply


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--user-token", required=True)
    parser.add_argument("--reviewer-token", required=True)
    parser.add_argument("text", nargs="?", default="refund order 42 for 30")
    args = parser.parse_args()
    sys.stdout.write(asyncio.run(main(args.url, args.user_token, args.reviewer_token, args.text)))
    sys.stdout.write("\n")
