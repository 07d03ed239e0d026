"""The client's event reducer (client_demo/static/js/store.js), run in Chromium on a real log.

A real thread log (two approvals in one pause, a rejection, a cancelled stream with
`message.aborted`, a queued input) is fed to the reducer whole, twice, resumed from a
half-way snapshot with an overlapping replay, and after a reset: every way ends in the same view.
"""

from __future__ import annotations

from typing import Any

import httpx

from gateway.auth import TokenVerifier
from tests.support.browser import DESKTOP, PageErrors
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, GatewayProcess

VERIFIER = TokenVerifier(TEST_SECRET)

REDUCE = """async (events) => {
  const { ThreadState, stats } = await import("/js/store.js");
  const view = (s) => JSON.stringify(s.toSnapshot(), (k, v) => (k === "v" ? undefined : v));
  const tid = events[0].thread_id;
  const sub = { thread_id: tid, epoch: "e1", head_seq: events.length, reset: false };
  const copy = (s) => ThreadState.fromSnapshot(tid, JSON.parse(JSON.stringify(s.toSnapshot())));

  const whole = new ThreadState(tid);
  whole.onSubscribed(sub);
  for (const e of events) whole.apply(e);
  const once = view(whole);
  const appliedAgain = events.filter((e) => whole.apply(e)).length;

  const half = new ThreadState(tid);
  half.onSubscribed(sub);
  const cut = Math.floor(events.length / 2);
  for (const e of events.slice(0, cut)) half.apply(e);
  const resumed = copy(half);
  for (const e of events.slice(Math.max(0, cut - 7))) resumed.apply(e);

  const reset = copy(whole);
  reset.onSubscribed({ ...sub, reset: true });
  const afterReset = reset.items.length;
  for (const e of events) reset.apply(e);

  return {
    once, twice: view(whole), resumed: view(resumed), reset: view(reset), appliedAgain, afterReset,
    mismatches: stats.deltaMismatches,
    items: whole.items.map((i) => ({ kind: i.kind, text: i.text ?? null, state: i.state ?? null,
      approvals: (i.approvals || []).map((a) => a.status) })),
    status: whole.status,
  };
}"""


async def test_reducer_is_idempotent_and_resumable(
    browser: Any, gateway: GatewayProcess, page_errors: PageErrors
) -> None:
    url = f"ws://127.0.0.1:{gateway.port}/v1/ws"
    alice = await Client.connect(url, VERIFIER.issue("alice", "acme", ["user"]))
    bob = await Client.connect(url, VERIFIER.issue("bob", "acme", ["reviewer"]))
    try:
        ack = await alice.request(
            "run.start", input="refund order 5 for 12 and email ann@example.com"
        )
        thread_id = ack["thread_id"]
        await alice.wait_event("run.paused")
        requested = [e for e in alice.events if e["event"] == "approval.requested"]
        assert len(requested) == 2
        await bob.request(
            "approval.decide", approval_id=requested[0]["data"]["approval_id"], decision="approve"
        )
        await bob.request(
            "approval.decide",
            approval_id=requested[1]["data"]["approval_id"],
            decision="reject",
            reason="no e-mails today",
        )
        await alice.wait_event("run.completed")

        story = await alice.request("run.input", thread_id=thread_id, input="tell me a story")
        assert story["disposition"] == "started"
        await alice.wait_for(
            lambda f: f.get("event") == "message.delta" and f.get("run_id") == story["run_id"]
        )
        await alice.request("run.input", thread_id=thread_id, input="hi there")  # queued
        await alice.request("run.cancel", run_id=story["run_id"])
        reply = await alice.wait_event("message.completed", text='You said: "hi there"')
        await alice.wait_for(
            lambda f: f.get("event") == "run.completed" and f["seq"] > reply["seq"]
        )
    finally:
        await alice.close()
        await bob.close()

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
        response = await http.get(
            f"/v1/threads/{thread_id}/events",
            params={"limit": 1000},
            headers={"Authorization": f"Bearer {VERIFIER.issue('alice', 'acme', ['user'])}"},
        )
    events = response.json()["events"]
    assert "message.aborted" in {e["event"] for e in events}

    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    page_errors.attach(page, "reducer")
    await page.goto(f"http://127.0.0.1:{gateway.port}/")
    result = await page.evaluate(REDUCE, events)

    assert result["appliedAgain"] == 0
    assert result["afterReset"] == 0
    assert result["once"] == result["twice"] == result["resumed"] == result["reset"]
    assert result["mismatches"] == 0
    assert result["status"] == "completed"
    items = result["items"]
    users = [(i["text"], i["state"]) for i in items if i["kind"] == "user"]
    assert users == [
        ("refund order 5 for 12 and email ann@example.com", "sent"),
        ("tell me a story", "sent"),
        ("hi there", "sent"),  # queued, then moved to where its own run started
    ]
    groups = [i["approvals"] for i in items if i["kind"] == "approvals"]
    assert groups == [["approved", "rejected"]]  # one card group for one pause
    completed = [e["data"]["text"] for e in events if e["event"] == "message.completed"]
    assistant = [i["text"] for i in items if i["kind"] == "assistant"]
    assert assistant == completed  # the aborted story left nothing behind
    assert "no e-mails today" in assistant[1]
