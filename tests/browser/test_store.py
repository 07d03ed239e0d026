"""The client package's event fold (client_demo/js/src/thread.js, served to the demo page as
/js/gateway-client/) and the page's view of it, run in Chromium on a real log.

A real thread log (two approvals in one pause, a rejection, a stopped stream whose
`message.aborted` keeps its text, a queued input) is folded whole, twice, resumed from a
half-way stored state with an overlapping replay, and after a reset: every way ends in the
same state.
"""

from __future__ import annotations

from typing import Any

import httpx

from gateway.auth.access import TokenVerifier
from tests.support.browser import DESKTOP, PageErrors
from tests.support.client import Client
from tests.support.gateway import TEST_SECRET, GatewayProcess

VERIFIER = TokenVerifier(TEST_SECRET)

REDUCE = """async (events) => {
  const { applyEvent, applySubscribed, emptyThread } = await import("/js/gateway-client/thread.js");
  const { viewItems } = await import("/js/view.js");
  const tid = events[0].thread_id;
  const sub = { thread_id: tid, epoch: "e1", head_seq: events.length, reset: false };
  const fold = (state, list) => list.reduce(applyEvent, state);
  // What a page stores and restores after a reload: plain JSON.
  const copy = (state) => JSON.parse(JSON.stringify(state));

  const whole = fold(applySubscribed(emptyThread(tid), sub), events);
  const once = JSON.stringify(whole);
  const again = fold(whole, events);

  const cut = Math.floor(events.length / 2);
  const half = fold(applySubscribed(emptyThread(tid), sub), events.slice(0, cut));
  const resumed = fold(copy(half), events.slice(Math.max(0, cut - 7)));

  const cleared = applySubscribed(copy(whole), { ...sub, reset: true });
  const reset = fold(cleared, events);

  const view = viewItems(whole);
  return {
    once, resumed: JSON.stringify(resumed), reset: JSON.stringify(reset),
    unchangedByReplay: again === whole, afterReset: cleared.items.length,
    mismatches: whole.mismatches,
    users: whole.items.filter((i) => i.kind === "input").map((i) => [i.text, i.status]),
    groups: view.filter((i) => i.kind === "approvals").map((i) => i.approvals.map((a) => a.status)),
    assistant: view.filter((i) => i.kind === "assistant").map((i) => i.text),
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

    assert result["unchangedByReplay"], "a replay of applied events changed the state"
    assert result["afterReset"] == 0
    assert result["once"] == result["resumed"] == result["reset"]
    assert result["mismatches"] == 0
    assert result["status"] == "completed"
    assert result["users"] == [
        ["refund order 5 for 12 and email ann@example.com", "started"],
        ["tell me a story", "started"],
        ["hi there", "started"],  # queued, then moved to where its own run started
    ]
    assert result["groups"] == [["approved", "rejected"]]  # one card group for one pause
    # Every message's final text in log order: the stopped story keeps what it streamed.
    ended = [
        e["data"]["text"]
        for e in events
        if e["event"] == "message.completed"
        or (e["event"] == "message.aborted" and "text" in e["data"])
    ]
    assert result["assistant"] == ended
    assert ended[2], "the story was stopped before any text"
    assert "no e-mails today" in result["assistant"][1]
