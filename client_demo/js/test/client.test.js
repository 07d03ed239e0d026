// The client against a real gateway process: approvals, a cut mid-story resumed exactly,
// disconnect versus cancel, silence detection, token renewal on the open socket.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { GatewayClient, memoryStore, messages, pendingApprovals } from "../src/index.js";
import { startGateway, trackedWebSocket, waitFor } from "./support/gateway.js";

const FAST_BACKOFF = { baseMs: 50, capMs: 500 };

/** @type {Awaited<ReturnType<typeof startGateway>>} */
let gateway;
const clients = [];

before(async () => {
  // No leeway, so a token is refused the moment it expires; a short heartbeat, so the
  // silence watch has something to watch.
  gateway = await startGateway({ GATEWAY_JWT_LEEWAY_S: "0", GATEWAY_HEARTBEAT_S: "0.5", GATEWAY_DEMO_DELAY_MS: "10" });
});

after(async () => {
  for (const client of clients) client.close();
  await gateway?.stop();
});

function client(options) {
  const c = new GatewayClient({ url: gateway.ws, backoff: FAST_BACKOFF, ...options });
  clients.push(c);
  return c.connect();
}

function threadDone(c, threadId) {
  return waitFor(c, "thread", () => {
    const s = c.thread(threadId);
    return ["completed", "failed", "cancelled"].includes(s.status) && s;
  });
}

async function completedTexts(threadId, token) {
  const { events } = await gateway.events(threadId, token);
  return events.filter((e) => e.event === "message.completed").map((e) => e.data.text);
}

describe("approval flow", () => {
  test("a reviewer's inbox shows the call, the approval is decided, the run completes", async () => {
    const aliceToken = await gateway.token("alice");
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token: aliceToken });
    const bob = client({ WebSocket: trackedWebSocket().WebSocket, token: await gateway.token("bob", ["reviewer"]) });
    await Promise.all([alice.ready(), bob.ready()]);
    await bob.subscribeInbox();

    const { threadId, runId } = await alice.startRun({ input: "refund order 42 for 30 dollars" });
    const waiting = await waitFor(alice, "thread", () => {
      const s = alice.thread(threadId);
      return s.status === "waiting_for_review" && s;
    });
    const [pending] = pendingApprovals(waiting);
    assert.equal(pending.toolName, "issue_refund");
    assert.deepEqual(pending.arguments, { order_id: 42, amount: 30 });
    assert.equal(waiting.activeRunId, runId);

    const [inboxed] = await waitFor(bob, "inbox", () => bob.inbox.length > 0 && bob.inbox);
    assert.equal(inboxed.approval_id, pending.id);
    const decided = await bob.approve(pending.id);
    assert.equal(decided.status, "approved");
    assert.equal(decided.reviewer, "bob");

    const done = await threadDone(alice, threadId);
    assert.equal(done.status, "completed");
    const approval = done.items.find((i) => i.kind === "approval");
    assert.equal(approval.status, "approved");
    assert.equal(approval.reviewer, "bob");
    const tool = done.items.find((i) => i.kind === "tool" && i.id === pending.callId);
    assert.equal(tool.status, "done");
    assert.ok(tool.output.length > 0);
    assert.deepEqual(
      messages(done).map((m) => m.text),
      await completedTexts(threadId, aliceToken),
    );
    await waitFor(bob, "inbox", () => bob.inbox.length === 0);
    // The user may not decide (GATEWAY_SELF_APPROVAL is off): the gateway's code comes through.
    await assert.rejects(alice.approve(pending.id), { code: "forbidden" });
  });

  test("a rejection's reason reaches the model and the approval shows it", async () => {
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token: await gateway.token("alice") });
    const bob = client({ WebSocket: trackedWebSocket().WebSocket, token: await gateway.token("bob", ["reviewer"]) });
    const { threadId } = await alice.ready().then(() => alice.startRun({ input: "refund order 7 for 5 dollars" }));
    const waiting = await waitFor(alice, "thread", () => pendingApprovals(alice.thread(threadId)).length && alice.thread(threadId));
    await bob.ready();
    await bob.reject(pendingApprovals(waiting)[0].id, "Refunds over the phone only.");
    const done = await threadDone(alice, threadId);
    const approval = done.items.find((i) => i.kind === "approval");
    assert.equal(approval.status, "rejected");
    assert.equal(approval.reason, "Refunds over the phone only.");
    assert.match(messages(done).at(-1).text, /Refunds over the phone only\./);
  });
});

describe("staged input", () => {
  test("input staged on a paused run that is cancelled shows as dropped; the next run does not take it", async () => {
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token: await gateway.token("alice") });
    await alice.ready();
    const { threadId, runId } = await alice.startRun({ input: "refund order 9 for 5 dollars" });
    await waitFor(alice, "thread", () => alice.thread(threadId).status === "waiting_for_review");
    const staged = await alice.sendInput(threadId, "make it 10 dollars");
    assert.deepEqual(staged, { disposition: "staged", runId });
    await waitFor(alice, "thread", () => alice.thread(threadId).items.some((i) => i.kind === "input" && i.status === "staged"));
    await alice.cancel(runId);
    const cancelled = await threadDone(alice, threadId);
    assert.equal(cancelled.status, "cancelled");
    const inputs = (s) => s.items.filter((i) => i.kind === "input").map((i) => [i.text, i.status]);
    assert.deepEqual(inputs(cancelled), [
      ["refund order 9 for 5 dollars", "started"],
      ["make it 10 dollars", "dropped"],
    ]);

    // The gateway forgets it: the next input starts a run that answers that input alone.
    const next = await alice.sendInput(threadId, "hello");
    assert.equal(next.disposition, "started");
    const done = await waitFor(alice, "thread", () => {
      const s = alice.thread(threadId);
      return s.runs[next.runId]?.status === "completed" && s;
    });
    assert.equal(messages(done).at(-1).text, 'You said: "hello"');
    assert.deepEqual(inputs(done).slice(1), [["make it 10 dollars", "dropped"], ["hello", "started"]]);
  });
});

describe("resuming", () => {
  test("a connection cut mid-story resumes from its cursor: no word missing or doubled", async () => {
    const token = await gateway.token("alice");
    const net = trackedWebSocket();
    const alice = client({ WebSocket: net.WebSocket, token });
    await alice.ready();
    let streamed = "";
    alice.on("event", (frame) => {
      if (frame.event === "message.delta") streamed += frame.data.delta;
    });
    const { threadId } = await alice.startRun({ input: "tell me a story" });
    // Cut the TCP connection (no close handshake) once the story is well under way.
    const cutAt = await waitFor(alice, "event", () => {
      const [message] = messages(alice.thread(threadId));
      return message?.status === "streaming" && message.text.split(" ").length >= 20 && alice.thread(threadId).seq;
    });
    net.current().terminate();
    const done = await threadDone(alice, threadId);

    const [completed] = await completedTexts(threadId, token);
    assert.ok(completed.split(/\s+/).length >= 200, "the story is long enough to cut");
    assert.equal(messages(done)[0].text, completed);
    assert.equal(streamed, completed, "the deltas applied add up to the completed text");
    assert.equal(done.mismatches, 0);
    assert.equal(alice.connection.stats.reconnects, 1);
    assert.equal(net.sockets.length, 2);
    assert.ok(alice.subscribedFrom[threadId] >= cutAt, "resubscribed from the cursor, not from the start");
    const { head_seq } = await gateway.events(threadId, token);
    assert.equal(done.seq, head_seq);
  });

  test("events already applied are dropped when a subscription replays them", async () => {
    const token = await gateway.token("alice");
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token });
    await alice.ready();
    const { threadId } = await alice.startRun({ input: "hello there" });
    const done = await threadDone(alice, threadId);
    // Move the cursor back by hand, as an older stored cursor would: the replay repeats
    // events that were applied, and the state does not change.
    const entry = alice.threads.get(threadId);
    entry.state = { ...entry.state, seq: 2 };
    const ack = await alice.subscribe(threadId);
    assert.equal(ack.thread_id, threadId);
    await waitFor(alice, "thread", () => alice.thread(threadId).seq === done.seq);
    assert.deepEqual(alice.thread(threadId).items, done.items);
  });

  test("a page reload restores state and cursor from the store and resumes after them", async () => {
    const token = await gateway.token("alice");
    const store = memoryStore();
    const first = client({ WebSocket: trackedWebSocket().WebSocket, token, store });
    await first.ready();
    const { threadId } = await first.startRun({ input: "tell me a story" });
    await waitFor(first, "event", () => messages(first.thread(threadId))[0]?.text.length > 50);
    first.close(); // disconnect, not cancel: the run goes on without anyone watching
    await new Promise((r) => setTimeout(r, 20)); // the store is written after the burst
    const saved = store.get(threadId);
    assert.ok(saved.seq > 0);

    const second = client({ WebSocket: trackedWebSocket().WebSocket, token, store });
    assert.equal(second.thread(threadId).seq, saved.seq);
    await second.ready();
    await second.subscribe(threadId);
    const done = await threadDone(second, threadId);
    assert.equal(done.status, "completed", "closing the connection did not stop the run");
    assert.equal(second.subscribedFrom[threadId], saved.seq);
    assert.equal(messages(done)[0].text, (await completedTexts(threadId, token))[0]);
    assert.equal(done.mismatches, 0);
  });

  test("input sent to a thread not yet watched loads the thread's history, and keeps it after a reconnect", async () => {
    const token = await gateway.token("alice");
    const first = client({ WebSocket: trackedWebSocket().WebSocket, token });
    await first.ready();
    const { threadId } = await first.startRun({ input: "hello there" });
    await threadDone(first, threadId);
    first.close();

    // Another device: nothing stored, and no subscribe before acting on the thread. The
    // gateway subscribes it from the new run's first event, after the earlier run.
    const net = trackedWebSocket();
    const second = client({ WebSocket: net.WebSocket, token });
    await second.ready();
    const { disposition, runId } = await second.sendInput(threadId, "and again");
    assert.equal(disposition, "started");
    const whole = async (c) => {
      const state = await waitFor(c, "thread", () => {
        const s = c.thread(threadId);
        return s.runs[runId]?.status === "completed" && s;
      }, 10_000);
      const { events, head_seq } = await gateway.events(threadId, token);
      assert.equal(state.seq, head_seq);
      assert.deepEqual(state.items.filter((i) => i.kind === "input").map((i) => i.text), ["hello there", "and again"]);
      assert.deepEqual(messages(state).map((m) => m.text), await completedTexts(threadId, token));
      assert.equal(events[0].seq, 1);
      assert.equal(state.mismatches, 0);
      return state;
    };
    const before = await whole(second);
    assert.ok(second.stats.gaps >= 1, "the events after the history were noticed as a gap");
    assert.equal(second.subscribedFrom[threadId], 0, "subscribed again from the start");

    // A reconnect resubscribes from the saved cursor: the history stays.
    net.current().terminate();
    await waitFor(second, "welcome", () => second.connection.stats.reconnects === 1);
    const after = await whole(second);
    assert.deepEqual(after.items, before.items);
  });

  test("cancel stops the run: the open message keeps its text, stopped, and the connection stays", async () => {
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token: await gateway.token("alice") });
    await alice.ready();
    const { threadId, runId } = await alice.startRun({ input: "tell me a story" });
    await waitFor(alice, "event", () => messages(alice.thread(threadId))[0]?.text.length > 0);
    const ack = await alice.cancel(runId);
    assert.equal(ack.run_id, runId);
    const done = await threadDone(alice, threadId);
    assert.equal(done.status, "cancelled");
    assert.equal(messages(done)[0].status, "stopped");
    assert.ok(messages(done)[0].text.length > 0);
    const { events } = await gateway.events(threadId, await gateway.token("alice"));
    const aborted = events.find((e) => e.event === "message.aborted");
    assert.equal(messages(done)[0].text, aborted.data.text);
    assert.equal(alice.status, "online");
  });

  test("a socket gone silent is given up and replaced", async () => {
    const net = trackedWebSocket();
    const alice = client({ WebSocket: net.WebSocket, token: await gateway.token("alice") });
    await alice.ready();
    const { threadId } = await alice.startRun({ input: "tell me a story" });
    await waitFor(alice, "event", () => messages(alice.thread(threadId))[0]?.status === "streaming");
    // The TCP connection stays open but nothing arrives any more, as when a network path dies.
    net.current()._socket.pause();
    const done = await threadDone(alice, threadId);
    assert.ok(alice.connection.stats.silences >= 1);
    assert.ok(alice.connection.stats.reconnects >= 1);
    assert.equal(done.mismatches, 0);
    assert.equal(done.status, "completed");
  });
});

describe("token renewal", () => {
  test("short-lived tokens are renewed on the open socket while a story streams", async () => {
    let minted = 0;
    const getToken = async () => {
      minted += 1;
      return gateway.token("alice", ["user"], 5);
    };
    const net = trackedWebSocket();
    const alice = client({ WebSocket: net.WebSocket, token: getToken, getToken });
    await alice.ready();
    const renewed = [];
    alice.on("renewed", (welcome) => renewed.push(welcome));
    const { threadId } = await alice.startRun({ input: "tell me a long story" });
    await threadDone(alice, threadId);
    // Outlive two tokens after the run, then prove the socket still serves requests.
    await waitFor(alice, "renewed", () => renewed.length >= 3);
    const { threadId: second } = await alice.startRun({ input: "hello again" });
    await threadDone(alice, second);
    assert.equal(net.sockets.length, 1, "one socket all along: no reconnect");
    assert.equal(alice.connection.stats.reconnects, 0);
    assert.ok(minted >= 4);
    assert.equal(renewed[0].user, "alice");
  });

  test("without a way to renew, the expired token's connection ends as unauthorized", async () => {
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token: await gateway.token("alice", ["user"], 5) });
    await alice.ready();
    const message = await new Promise((resolve) => alice.on("unauthorized", resolve));
    assert.match(message, /expired/);
    assert.equal(alice.status, "unauthorized");
  });
});

describe("events", () => {
  test("status and welcome are reported on connect and on every reconnect", async () => {
    const net = trackedWebSocket();
    const alice = new GatewayClient({ url: gateway.ws, backoff: FAST_BACKOFF, WebSocket: net.WebSocket, token: await gateway.token("alice") });
    clients.push(alice);
    const statuses = [];
    const welcomes = [];
    alice.on("status", (status) => statuses.push(status));
    alice.on("welcome", (welcome) => welcomes.push(welcome));
    await alice.connect().ready();
    net.current().terminate();
    await waitFor(alice, "welcome", () => welcomes.length === 2);
    assert.deepEqual(statuses.slice(0, 2), ["connecting", "online"]);
    assert.ok(statuses.includes("offline"));
    assert.equal(statuses.at(-1), "online");
    assert.equal(welcomes[1].user, "alice");
    alice.close();
    assert.equal(alice.status, "closed");
  });
});

describe("requests", () => {
  test("a request made while connecting is sent once welcomed; one on a closed client is refused", async () => {
    const net = trackedWebSocket();
    const alice = new GatewayClient({ url: gateway.ws, WebSocket: net.WebSocket, token: await gateway.token("alice") });
    clients.push(alice);
    alice.connect();
    assert.equal(alice.status, "connecting");
    const { threadId } = await alice.startRun({ input: "hello early" });
    const done = await threadDone(alice, threadId);
    assert.equal(messages(done)[0].text, 'You said: "hello early"');
    assert.equal(net.sockets.length, 1);
    alice.close();
    await assert.rejects(alice.sendInput(threadId, "too late"), { code: "offline" });
  });
});

describe("approve with edits", () => {
  test("a reviewer approves a refund for another amount; the tool and the model get the edit", async () => {
    const aliceToken = await gateway.token("alice");
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token: aliceToken });
    const bob = client({ WebSocket: trackedWebSocket().WebSocket, token: await gateway.token("bob", ["reviewer"]) });
    await Promise.all([alice.ready(), bob.ready()]);
    const { threadId } = await alice.startRun({ input: "refund order 42 for 80 dollars" });
    const waiting = await waitFor(alice, "thread", () => {
      const s = alice.thread(threadId);
      return s.status === "waiting_for_review" && s;
    });
    const [pending] = pendingApprovals(waiting);
    assert.equal(pending.argumentsEditable, true);
    await assert.rejects(bob.approve(pending.id, { order_id: 42, amount: "lots" }), { code: "bad_request" });
    const decided = await bob.approve(pending.id, { order_id: 42, amount: 60 });
    assert.deepEqual(decided.edited_arguments, { order_id: 42, amount: 60 });
    assert.deepEqual(decided.arguments, { order_id: 42, amount: 80 });
    const done = await threadDone(alice, threadId);
    const approval = done.items.find((i) => i.kind === "approval");
    assert.deepEqual(approval.editedArguments, { order_id: 42, amount: 60 });
    const tool = done.items.find((i) => i.kind === "tool" && i.id === pending.callId);
    assert.match(tool.output, /^\[A reviewer approved this call with changed arguments: .*"amount":60/);
    assert.match(tool.output, /Refund of 60\.00 USD issued for order 42/);
    assert.match(messages(done).at(-1).text, /Refund of 60\.00 USD issued for order 42/);
  });
});

describe("omit", () => {
  test("a view without reasoning asks the gateway to leave it out, and sees no gap", async () => {
    const token = await gateway.token("alice");
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token, omit: ["reasoning", "usage"] });
    const welcome = await alice.ready();
    assert.deepEqual(welcome.omit, ["reasoning", "usage"]);
    // The offline model streams a reasoning summary for input with "think" (§9).
    const { threadId } = await alice.startRun({ input: "think about tea" });
    const done = await threadDone(alice, threadId);
    assert.equal(messages(done).at(-1).text, 'You said: "think about tea"');
    assert.equal(done.items.filter((i) => i.kind === "reasoning").length, 0);
    assert.equal(alice.stats.gaps, 0);
    const { events } = await gateway.events(threadId, token);
    assert.ok(events.some((e) => e.event === "reasoning.delta"));
    assert.equal(done.seq, events.at(-1).seq);
  });
});

describe("versions", () => {
  test("regenerate supersedes the last answer and keeps the earlier one as a version", async () => {
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token: await gateway.token("alice") });
    await alice.ready();
    const { threadId, runId } = await alice.startRun({ input: "hello there" });
    await threadDone(alice, threadId);
    const again = await alice.regenerate(threadId, { input: "hello again", runId });
    assert.equal(again.supersedes, runId);
    const done = await waitFor(alice, "thread", () => {
      const s = alice.thread(threadId);
      return s.runs[again.runId]?.status === "completed" && s;
    });
    assert.equal(done.runs[runId].supersededBy, again.runId);
    assert.equal(done.runs[again.runId].supersedes, runId);
    assert.deepEqual(messages(done).map((m) => [m.runId, m.text]), [
      [runId, 'You said: "hello there"'],
      [again.runId, 'You said: "hello again"'],
    ]);
    await assert.rejects(alice.regenerate(threadId, { runId }), /only the thread's last answer/);
  });

  test("retry goes on from a failed run's last checkpoint, and both runs stay", async () => {
    const token = await gateway.token("alice");
    const alice = client({ WebSocket: trackedWebSocket().WebSocket, token });
    await alice.ready();
    // The offline model fails the answer after the lookup once (docs/protocol.md §9 `flaky`).
    const { threadId, runId } = await alice.startRun({ input: "a flaky lookup of order 7" });
    const failed = await threadDone(alice, threadId);
    assert.equal(failed.status, "failed");
    assert.match(failed.runs[runId].error.message, /simulated outage/);
    const retried = await alice.retry(runId);
    assert.equal(retried.retries, runId);
    assert.equal(retried.threadId, threadId);
    assert.equal(typeof retried.checkpointVersion, "number");
    const done = await waitFor(alice, "thread", () => {
      const s = alice.thread(threadId);
      return s.runs[retried.runId]?.status === "completed" && s;
    });
    assert.equal(done.runs[runId].status, "failed");
    assert.equal(done.runs[runId].retriedBy, retried.runId);
    assert.equal(done.runs[retried.runId].retries, runId);
    // The input is shown once: the retry goes on with the same question.
    assert.deepEqual(done.items.filter((i) => i.kind === "input").map((i) => i.text), ["a flaky lookup of order 7"]);
    const answer = messages(done).at(-1);
    assert.equal(answer.runId, retried.runId);
    assert.match(answer.text, /^Here is what happened:\n- Order 7: /);
    // The lookup ran once: the retry went on after it.
    const { events } = await gateway.events(threadId, token);
    assert.deepEqual(events.filter((e) => e.event === "tool.output").map((e) => e.run_id), [runId]);
    await assert.rejects(alice.retry(runId), /only the thread's last run/);
  });
});
