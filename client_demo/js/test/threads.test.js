// The thread list through the client package (docs/protocol.md §4 `threads.subscribe`,
// `thread.update`, `thread.delete`) against a real gateway: titles, live status and pending
// approvals, renames, archives and deletes from another client, and the list followed again
// after a reconnect.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import WebSocket from "ws";
import { GatewayClient } from "../src/index.js";
import { startGateway, waitFor } from "./support/gateway.js";

const FAST_BACKOFF = { baseMs: 50, capMs: 500 };

/** @type {Awaited<ReturnType<typeof startGateway>>} */
let gateway;
const clients = [];

before(async () => {
  gateway = await startGateway();
});

after(async () => {
  for (const client of clients) client.close();
  await gateway?.stop();
});

function client(token) {
  const c = new GatewayClient({ url: gateway.ws, backoff: FAST_BACKOFF, token, WebSocket });
  clients.push(c);
  return c.connect();
}

function listed(c, threadId, predicate) {
  return waitFor(c, "threads", () => {
    const thread = c.threadList.find((t) => t.thread_id === threadId);
    return thread && predicate(thread) && thread;
  });
}

describe("the thread list", () => {
  test("titles, status and pending approvals follow the runs; renames, archives and deletes reach every list", async () => {
    const aliceToken = await gateway.token("alice");
    const phone = client(aliceToken); // the list on another of alice's devices
    const alice = client(aliceToken);
    const bob = client(await gateway.token("bob", ["reviewer"]));
    await Promise.all([phone.ready(), alice.ready(), bob.ready()]);
    await phone.subscribeThreads();
    await waitFor(phone, "threads", () => true);
    assert.deepEqual(phone.threadList, []);

    const { threadId } = await alice.startRun({ input: "refund order 42 for 30 dollars" });
    const waiting = await listed(phone, threadId, (t) => t.pending_approvals === 1);
    assert.equal(waiting.title, "refund order 42 for 30 dollars");
    assert.equal(waiting.status, "waiting_for_review");

    await bob.subscribeInbox();
    const [approval] = await waitFor(bob, "inbox", () => bob.inbox.length > 0 && bob.inbox);
    await bob.approve(approval.approval_id);
    await listed(phone, threadId, (t) => t.status === "completed" && t.pending_approvals === 0);

    const renamed = await alice.renameThread(threadId, "Ann's refund");
    assert.equal(renamed.title, "Ann's refund");
    await listed(phone, threadId, (t) => t.title === "Ann's refund");
    await assert.rejects(alice.renameThread(threadId, "   "), { code: "bad_request" });
    await assert.rejects(bob.renameThread(threadId, "mine"), { code: "forbidden" });

    // Through a reconnect the list is followed again, and changes made meanwhile arrive.
    phone.connection.reconnect();
    await alice.archiveThread(threadId);
    await waitFor(phone, "threads", () => phone.status === "online" && phone.threadList.length === 0);
    const archive = client(aliceToken);
    await archive.ready();
    await archive.subscribeThreads({ archived: true });
    await listed(archive, threadId, (t) => t.archived);
    await alice.archiveThread(threadId, false);
    await listed(phone, threadId, (t) => !t.archived);
    await waitFor(archive, "threads", () => archive.threadList.length === 0);

    await alice.deleteThread(threadId);
    await waitFor(phone, "threads", () => phone.threadList.length === 0);
    assert.equal(alice.threads.has(threadId), false);
    await assert.rejects(alice.subscribe(threadId), { code: "not_found" });
  });
});
