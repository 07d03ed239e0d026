"""The webhook reviewer example (client_demo/webhook_reviewer.py) run as documented: it gets
the gateway's `approval.requested` webhook, refuses what is not signed with the secret, and
approves the refund over HTTP."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import httpx

from tests.integration.test_webhooks import FAST, REFUND, SECRET, start_run
from tests.support.gateway import ROOT
from tests.support.ports import free_port


async def listening(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            assert time.monotonic() < deadline, "the example does not listen"
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


async def test_the_webhook_reviewer_example_approves_a_refund(gateway_factory: Any) -> None:
    port = free_port()
    async with gateway_factory(webhook_url=f"http://127.0.0.1:{port}/webhooks", **FAST) as gw:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "client_demo.webhook_reviewer",
            "--url",
            gw.http_url,
            "--reviewer-token",
            gw.token("rita", "reviewer"),
            "--port",
            str(port),
            "--once",
            cwd=ROOT,
            env={**os.environ, "GATEWAY_WEBHOOK_SECRET": SECRET},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await listening(port)
            async with httpx.AsyncClient(timeout=10) as http:
                forged = await http.post(
                    f"http://127.0.0.1:{port}/webhooks",
                    content=b'{"type": "approval.requested"}',
                    headers={
                        "Webhook-Id": "msg_forged",
                        "Webhook-Timestamp": str(int(time.time())),
                        "Webhook-Signature": "v1=" + "0" * 64,
                    },
                )
            assert forged.status_code == 401
            run = await start_run(gw.http_url, gw.token("alice", "user"), REFUND)
            out, err = await asyncio.wait_for(process.communicate(), 60)
        finally:
            if process.returncode is None:
                process.kill()
        assert process.returncode == 0, err.decode()
        assert "approve" in out.decode() and "(issue_refund): 200" in out.decode()
        headers = {"Authorization": f"Bearer {gw.token('alice', 'user')}"}
        async with gw.http() as http:
            deadline = time.monotonic() + 30
            while True:
                state = (await http.get(f"/v1/runs/{run['run_id']}", headers=headers)).json()
                if state["run"]["status"] == "completed":
                    break
                assert time.monotonic() < deadline, state
                await asyncio.sleep(0.1)
