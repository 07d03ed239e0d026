// An epoch change: retention cuts a thread's log and gives it a new epoch, so the stored
// cursor cannot be honoured. The gateway answers `subscribed` with `reset: true`, and the
// client throws its view away and reloads the thread from the oldest stored event.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { GatewayClient, memoryStore, messages } from "../src/index.js";
import { startGateway, trackedWebSocket, waitFor } from "./support/gateway.js";

let gateway;
const clients = [];

before(async () => {
  // Ended runs older than 0.2 s are swept every 0.3 s.
  gateway = await startGateway({ GATEWAY_RETENTION_S: "0.2", GATEWAY_RETENTION_SWEEP_S: "0.3" });
});

after(async () => {
  for (const c of clients) c.close();
  await gateway?.stop();
});

function client(token, store) {
  const c = new GatewayClient({ url: gateway.ws, WebSocket: trackedWebSocket().WebSocket, token, store });
  clients.push(c);
  return c.connect();
}

function runEnded(c, threadId, runId) {
  return waitFor(c, "thread", () => c.thread(threadId).runs[runId]?.status === "completed" && c.thread(threadId));
}

test("a cursor from an older epoch resets the thread and reloads it", async () => {
  const token = await gateway.token("alice");
  const store = memoryStore();
  const first = client(token, store);
  await first.ready();
  const { threadId, runId } = await first.startRun({ input: "hello before the cut" });
  const before = await runEnded(first, threadId, runId);
  assert.equal(messages(before).length, 1);
  first.close();
  await new Promise((r) => setTimeout(r, 20)); // the store is written after the burst

  // Wait for the sweep to cut the log (a new epoch).
  let truncated = 0;
  while (truncated < before.seq) {
    await new Promise((r) => setTimeout(r, 200));
    truncated = (await gateway.events(threadId, token)).truncated_seq ?? 0;
  }

  const second = client(token, store);
  assert.equal(second.thread(threadId).epoch, before.epoch, "restored from the store");
  const resets = [];
  second.on("reset", (id) => resets.push(id));
  await second.ready();
  await second.subscribe(threadId);
  await waitFor(second, "thread", () => second.thread(threadId).epoch !== before.epoch);
  assert.deepEqual(resets, [threadId]);
  assert.equal(second.stats.resets, 1);
  const reloaded = second.thread(threadId);
  assert.deepEqual(reloaded.items, [], "nothing from the old epoch is shown");
  assert.equal(reloaded.seq, 0);

  // The thread goes on under its new epoch; sequence numbers continue where they were.
  const { runId: next } = await second.sendInput(threadId, "hello after the cut");
  const after = await runEnded(second, threadId, next);
  assert.deepEqual(messages(after).map((m) => m.status), ["completed"]);
  assert.equal(after.items[0].kind, "input");
  assert.equal(after.items[0].text, "hello after the cut");
  assert.ok(after.items[0].seq > before.seq);
  assert.equal(store.get(threadId).epoch, after.epoch);
});
