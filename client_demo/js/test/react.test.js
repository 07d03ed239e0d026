// useThread in React's test renderer (no DOM) against a real gateway: a streamed answer
// rendered as it arrives, then an approval rendered, decided through a reviewer's hook, and
// the run completing on screen.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { createElement as h } from "react";
import TestRenderer, { act } from "react-test-renderer";
import { GatewayClient } from "../src/index.js";
import { useThread } from "../src/react.js";
import { startGateway, trackedWebSocket } from "./support/gateway.js";

let gateway;
const clients = [];

before(async () => {
  gateway = await startGateway({ GATEWAY_DEMO_DELAY_MS: "10" });
});

after(async () => {
  for (const c of clients) c.close();
  await gateway?.stop();
});

async function client(user, roles) {
  const c = new GatewayClient({ url: gateway.ws, WebSocket: trackedWebSocket().WebSocket, token: await gateway.token(user, roles) });
  clients.push(c);
  await c.connect().ready();
  return c;
}

/** A chat view: one element per item, carrying what a test (or a person) needs to see. */
function Chat({ client, threadId, handle }) {
  const thread = useThread(client, threadId);
  handle.current = thread;
  return h(
    "main",
    { "data-status": thread.state.status, "data-connection": thread.connection },
    thread.state.items.map((item) =>
      h("p", { key: `${item.kind}:${item.id}`, "data-kind": item.kind, "data-status": item.status, "data-id": item.id }, item.text ?? item.toolName),
    ),
  );
}

function render(props) {
  const handle = { current: null };
  let renderer;
  act(() => {
    renderer = TestRenderer.create(h(Chat, { ...props, handle }));
  });
  return { renderer, handle };
}

async function eventually(check, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 20));
  }
}

const byKind = (renderer, kind) => renderer.root.findAll((n) => n.type === "p" && n.props["data-kind"] === kind);
const text = (node) => node.children.join("");

test("useThread renders a streamed answer, then an approval decided through the hook", async () => {
  const alice = await client("alice", ["user"]);
  const { renderer, handle } = render({ client: alice, threadId: null });
  assert.equal(renderer.root.findByType("main").props["data-connection"], "online");

  // A new conversation: the first send creates the thread and the hook follows it.
  await act(() => handle.current.send("tell me a story"));
  const threadId = handle.current.threadId;
  assert.ok(threadId);
  const seen = new Set();
  await eventually(() => {
    const [message] = byKind(renderer, "message");
    if (message) seen.add(text(message));
    return message?.props["data-status"] === "completed";
  });
  const { events } = await gateway.events(threadId, await gateway.token("alice"));
  const completed = events.find((e) => e.event === "message.completed").data.text;
  assert.equal(text(byKind(renderer, "message")[0]), completed);
  assert.ok(seen.size > 2, "the answer was rendered while it streamed");
  await eventually(() => renderer.root.findByType("main").props["data-status"] === "completed");

  // A second input on the same thread needs an approval; a reviewer's hook decides it.
  await act(() => handle.current.send("refund order 42 for 30 dollars"));
  // approval.requested and run.paused are two frames: wait for both to be rendered.
  const [approval] = await eventually(() => {
    const found = byKind(renderer, "approval");
    const paused = renderer.root.findByType("main").props["data-status"] === "waiting_for_review";
    return paused && found.length && found;
  });
  assert.equal(text(approval), "issue_refund");
  assert.equal(approval.props["data-status"], "pending");

  const bob = await client("bob", ["reviewer"]);
  const review = render({ client: bob, threadId });
  const [seenByBob] = await eventually(() => byKind(review.renderer, "approval").length && byKind(review.renderer, "approval"));
  assert.equal(seenByBob.props["data-id"], approval.props["data-id"]);
  await act(() => review.handle.current.approve(approval.props["data-id"]));

  await eventually(() => renderer.root.findByType("main").props["data-status"] === "completed");
  assert.equal(byKind(renderer, "approval")[0].props["data-status"], "approved");
  assert.equal(byKind(renderer, "tool")[0].props["data-status"], "done");
  assert.equal(byKind(renderer, "input").length, 2);
  // Alice may not decide her own call: the hook rejects and keeps the error.
  await act(() => handle.current.approve(approval.props["data-id"]).catch(() => {}));
  assert.equal(handle.current.error?.code, "forbidden");
  act(() => renderer.unmount());
  act(() => review.renderer.unmount());
});
