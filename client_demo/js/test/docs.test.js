// The two examples of docs/frontend.md ("Build your own frontend"), taken from the page as they
// are and run against a real gateway: the plain JavaScript one in Node (with `ws` as its
// WebSocket and a stand-in for the app's token endpoint), the React one compiled from JSX and
// rendered in React's test renderer.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { GatewayClient } from "../src/index.js";
import { ROOT, startGateway, trackedWebSocket, waitFor } from "./support/gateway.js";

const PACKAGE = dirname(dirname(fileURLToPath(import.meta.url)));
// Inside the package, so the examples' `import ... from "agents-ws-gateway-client"` resolves
// to this package (Node resolves a package's own name from within it).
const WORK = join(PACKAGE, ".docs-tmp");
const PLACEHOLDER_URL = "wss://gateway.example.com/v1/ws";

let gateway;
const children = [];

before(async () => {
  gateway = await startGateway({ GATEWAY_DEMO_DELAY_MS: "5" });
  mkdirSync(WORK, { recursive: true });
  // What a browser page has and Node lacks, and the app's own token endpoint, which here
  // hands out development tokens for TOKEN_USER with TOKEN_ROLES.
  writeFileSync(
    join(WORK, "preamble.mjs"),
    `import WebSocket from "ws";
globalThis.WebSocket = WebSocket;
const realFetch = globalThis.fetch;
globalThis.fetch = async (url, init) => {
  if (url !== "/my-app/gateway-token") return realFetch(url, init);
  const response = await realFetch(process.env.GATEWAY_HTTP + "/v1/dev/token", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ user: process.env.TOKEN_USER, roles: process.env.TOKEN_ROLES.split(",") }),
  });
  return new Response((await response.json()).token);
};
const entries = new Map();
globalThis.sessionStorage = {
  getItem: (key) => entries.get(key) ?? null,
  setItem: (key, value) => void entries.set(key, String(value)),
  removeItem: (key) => void entries.delete(key),
};
`,
  );
});

after(async () => {
  for (const child of children) child.kill();
  rmSync(WORK, { recursive: true, force: true });
  await gateway?.stop();
});

function codeBlocks(language) {
  const page = readFileSync(join(ROOT, "docs", "frontend.md"), "utf8");
  const blocks = [...page.matchAll(/```(\w+)\n([\s\S]*?)```/g)].filter((m) => m[1] === language).map((m) => m[2]);
  assert.equal(blocks.length, 1, `one ${language} example in docs/frontend.md`);
  assert.ok(blocks[0].includes(PLACEHOLDER_URL));
  return blocks[0].replace(PLACEHOLDER_URL, gateway.ws);
}

/** Run a module of WORK in its own Node process; `lines` collects its output. */
function run(file, user, roles) {
  const child = spawn(process.execPath, [join(WORK, file)], {
    cwd: PACKAGE,
    env: { ...process.env, GATEWAY_HTTP: gateway.http, TOKEN_USER: user, TOKEN_ROLES: roles },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  const lines = [];
  let stderr = "";
  const output = { on: (_name, fn) => ((output.fn = fn), () => (output.fn = null)), fn: null };
  let buffer = "";
  child.stdout.on("data", (chunk) => {
    buffer += chunk;
    const parts = buffer.split("\n");
    buffer = parts.pop();
    lines.push(...parts);
    output.fn?.();
  });
  child.stderr.on("data", (chunk) => (stderr += chunk));
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve({ code, stderr })));
  return { lines, output, exited, stderr: () => stderr };
}

test("the plain JavaScript example streams, waits for a reviewer, and completes", async () => {
  writeFileSync(join(WORK, "plain.mjs"), `import "./preamble.mjs";\n${codeBlocks("js")}`);
  const example = run("plain.mjs", "paula", "user");
  const waiting = await waitFor(example.output, "line", () =>
    example.lines.find((line) => line.startsWith("waiting for a reviewer:")),
  ).catch((error) => assert.fail(`${error.message}\n${example.lines.join("\n")}\n${example.stderr()}`));
  assert.equal(waiting, 'waiting for a reviewer: issue_refund {"order_id":42,"amount":30}');
  assert.ok(example.lines.includes("connection: online"));

  const reviewer = new GatewayClient({ url: gateway.ws, WebSocket: trackedWebSocket().WebSocket, token: await gateway.token("rene", ["reviewer"]) });
  try {
    await reviewer.connect().ready();
    await reviewer.subscribeInbox();
    const [approval] = await waitFor(reviewer, "inbox", () => reviewer.inbox.length && reviewer.inbox);
    await reviewer.approve(approval.approval_id);
  } finally {
    reviewer.close();
  }
  // The final output spans several lines: everything from "done:" on.
  const done = await waitFor(example.output, "line", () => {
    const start = example.lines.findIndex((line) => line.startsWith("done:"));
    return start >= 0 && /Refund of 30\.00 USD/.test(example.lines.slice(start).join("\n"));
  });
  assert.ok(done);
  assert.ok(example.lines.some((line) => line.startsWith("assistant: I will refund 30.00 USD for order 42")));
});

test("the React example renders a streamed answer and an approval decided through its buttons", async () => {
  const compiled = ts.transpileModule(codeBlocks("jsx"), {
    compilerOptions: { jsx: ts.JsxEmit.ReactJSX, module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
  }).outputText;
  writeFileSync(join(WORK, "react-example.mjs"), compiled);
  // Drives <Chat /> as a person would: type, submit, press Approve; prints what it rendered.
  writeFileSync(
    join(WORK, "react-harness.mjs"),
    `import "./preamble.mjs";
import { createElement as h } from "react";
import TestRenderer, { act } from "react-test-renderer";
import { Chat } from "./react-example.mjs";

let renderer;
act(() => { renderer = TestRenderer.create(h(Chat, {})); });
const root = () => renderer.root;
const until = async (check) => { while (!check()) await new Promise((r) => setTimeout(r, 20)); };
const status = () => root().findByType("main").props["data-status"];
const texts = (kind) => root().findAll((n) => n.type === "div" && n.props.className === kind)
  .map((n) => n.children.filter((c) => typeof c === "string").join(""));
const button = (label) => root().findAll((n) => n.type === "button" && n.children.includes(label))[0];
const send = (value) => act(() => root().findByType("form").props.onSubmit({ preventDefault() {}, target: { text: { value }, reset() {} } }));

await send("tell me a story");
const seen = new Set();
await until(() => { seen.add(texts("message")[0] ?? ""); return status() === "completed"; });
await send("refund order 42 for 30 dollars");
await until(() => button("Approve"));
const pendingTool = texts("approval")[0];
const stopShown = Boolean(button("Stop"));
await act(() => button("Approve").props.onClick());
await until(() => status() === "completed" && !button("Approve"));
console.log(JSON.stringify({ messages: texts("message"), inputs: texts("input"), pendingTool, stopShown, streamed: seen.size }));
process.exit(0);
`,
  );
  const user = "rita";
  const harness = run("react-harness.mjs", user, "user,reviewer");
  const { code, stderr } = await harness.exited;
  assert.equal(code, 0, stderr);
  const result = JSON.parse(harness.lines.at(-1));
  assert.deepEqual(result.inputs, ["tell me a story", "refund order 42 for 30 dollars"]);
  assert.equal(result.pendingTool, "issue_refund");
  assert.equal(result.stopShown, true, "a run waiting for review can be stopped");
  assert.ok(result.streamed > 2, "the story was rendered while it streamed");

  const token = await gateway.token(user);
  const threads = await (await fetch(`${gateway.http}/v1/threads`, { headers: { authorization: `Bearer ${token}` } })).json();
  assert.equal(threads.threads.length, 1);
  const { events } = await gateway.events(threads.threads[0].thread_id, token);
  const completed = events.filter((e) => e.event === "message.completed").map((e) => e.data.text);
  assert.deepEqual(result.messages, completed);
  assert.ok(events.some((e) => e.event === "approval.decided" && e.data.reviewer === user && e.data.decision === "approve"));
});
