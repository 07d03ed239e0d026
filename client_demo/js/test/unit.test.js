// The pure parts, without a gateway: back-off delays, renewal times, cursor stores.

import assert from "node:assert/strict";
import { test } from "node:test";
import { applyEvent, backoffDelay, emptyThread, memoryStore, renewalDelay, webStorageStore } from "../src/index.js";

const jwt = (claims) => `e30.${Buffer.from(JSON.stringify(claims)).toString("base64url")}.sig`;

test("back-off doubles its ceiling per attempt up to the cap, half of it fixed and half random", () => {
  const low = (attempt) => backoffDelay(attempt, { baseMs: 100, capMs: 1_000, random: () => 0 });
  const high = (attempt) => backoffDelay(attempt, { baseMs: 100, capMs: 1_000, random: () => 0.999999 });
  assert.deepEqual([0, 1, 2, 3, 4, 10, 1000].map(low), [50, 100, 200, 400, 500, 500, 500]);
  for (const attempt of [0, 1, 2, 3]) {
    assert.ok(high(attempt) < 100 * 2 ** attempt && high(attempt) > 0.99 * 100 * 2 ** attempt);
  }
  const spread = new Set(Array.from({ length: 20 }, () => backoffDelay(3)));
  assert.ok(spread.size > 1, "jittered: not every client waits the same");
});

test("renewal: at 80 % of the lifetime, at least 3 s before exp, from when the token arrived", () => {
  assert.equal(renewalDelay(jwt({ iat: 1000, exp: 4600 }), 1000 * 1000, 1000 * 1000), 2_880_000);
  assert.equal(renewalDelay(jwt({ iat: 1000, exp: 1008 }), 1000 * 1000, 1000 * 1000), 5_000);
  // A local clock running late does not make the renewal late: the lifetime counts.
  assert.equal(renewalDelay(jwt({ iat: 1000, exp: 1060 }), 900 * 1000, 900 * 1000), 48_000);
  assert.equal(renewalDelay(jwt({ iat: 1000 }), 0, 0), null);
  assert.equal(renewalDelay("not-a-token", 0, 0), null);
  assert.equal(renewalDelay(jwt({ iat: 1000, exp: 1002 }), 1000 * 1000, 1000 * 1000), 0);
});

test("cursor stores keep one entry per thread; a full Web Storage loses persistence, not events", () => {
  const entry = { epoch: "e1", seq: 7, state: { threadId: "t1", seq: 7 } };
  const memory = memoryStore();
  memory.set("t1", entry);
  assert.deepEqual(memory.get("t1"), entry);
  memory.delete("t1");
  assert.equal(memory.get("t1"), null);

  const items = new Map();
  const storage = {
    getItem: (k) => items.get(k) ?? null,
    setItem: (k, v) => items.set(k, v),
    removeItem: (k) => items.delete(k),
  };
  const web = webStorageStore(storage, "p.");
  web.set("t1", entry);
  assert.deepEqual(JSON.parse(items.get("p.t1")), entry);
  assert.deepEqual(web.get("t1"), entry);
  items.set("p.t2", "{not json");
  assert.equal(web.get("t2"), null);
  const full = webStorageStore({ ...storage, setItem: () => { throw new Error("QuotaExceededError"); } }, "p.");
  assert.doesNotThrow(() => full.set("t3", entry));
});

test("a thread folds reasoning summaries and counts its runs' tokens", () => {
  const frame = (seq, event, data) => ({ type: "event", thread_id: "t", seq, run_id: "r", event, ts: "", data });
  const call = { input_tokens: 10, output_tokens: 4, total_tokens: 14, cached_tokens: 2, reasoning_tokens: 1 };
  const events = [
    frame(1, "run.started", { input: "hi", agent: "a" }),
    frame(2, "reasoning.started", { reasoning_id: "m1", agent: "a" }),
    frame(3, "reasoning.delta", { reasoning_id: "m1", delta: "Think" }),
    frame(4, "reasoning.delta", { reasoning_id: "m1", delta: "ing." }),
    frame(5, "model.usage", { agent: "a", ...call }),
    frame(6, "model.usage", { agent: "a", ...call }),
  ];
  let state = emptyThread("t");
  for (const event of events) state = applyEvent(state, event);
  const [reasoning] = state.items.filter((i) => i.kind === "reasoning");
  assert.deepEqual([reasoning.text, reasoning.status], ["Thinking.", "streaming"]);
  assert.deepEqual(state.runs.r.usage, { requests: 2, input_tokens: 20, output_tokens: 8, total_tokens: 28, cached_tokens: 4, reasoning_tokens: 2 });
  state = applyEvent(state, frame(7, "reasoning.completed", { reasoning_id: "m1", text: "Thinking." }));
  const totals = { requests: 2, input_tokens: 21, output_tokens: 8, total_tokens: 29, cached_tokens: 4, reasoning_tokens: 2 };
  state = applyEvent(state, frame(8, "run.completed", { final_output: "", usage: totals }));
  assert.equal(state.items.find((i) => i.kind === "reasoning").status, "completed");
  assert.deepEqual(state.runs.r.usage, totals);
});

test("input staged on a paused run is delivered when the run resumes or is recovered, dropped when it ends first", () => {
  const frame = (seq, event, data = {}) => ({ type: "event", thread_id: "t", seq, run_id: "r", event, ts: "", data });
  const paused = [
    frame(1, "run.started", { input: "refund", agent: "a" }),
    frame(2, "run.paused", { reason: "approval" }),
    frame(3, "input.staged", { input: "and more" }),
  ];
  const staged = (ending) => [...paused, ending].reduce(applyEvent, emptyThread("t")).items.find((i) => i.text === "and more").status;
  assert.equal(staged(frame(4, "run.resumed")), "delivered");
  // Taken over after its claim to continue: the recovery applies the staged input.
  assert.equal(staged(frame(4, "run.recovered", { checkpoint_version: 2 })), "delivered");
  assert.equal(staged(frame(4, "run.cancelled")), "dropped");
  assert.equal(staged(frame(4, "run.failed", { error: { code: "internal", message: "x" } })), "dropped");
});
