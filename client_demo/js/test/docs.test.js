// The two examples of docs/frontend.md ("Build your own frontend"), taken from the page as they
// are and run against a real gateway: the plain JavaScript one in Node (with `ws` as its
// WebSocket and a stand-in for the app's token endpoint), the React one compiled from JSX and
// rendered in React's test renderer.

import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
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
// A tab's sessionStorage; with STORAGE_FILE it outlives the process, as a tab's outlives a reload.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
const file = process.env.STORAGE_FILE;
const entries = new Map(file && existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) : []);
const save = () => file && writeFileSync(file, JSON.stringify([...entries]));
globalThis.sessionStorage = {
  getItem: (key) => entries.get(key) ?? null,
  setItem: (key, value) => void (entries.set(key, String(value)), save()),
  removeItem: (key) => void (entries.delete(key), save()),
};
`,
  );
});

after(async () => {
  for (const child of children) child.kill();
  rmSync(WORK, { recursive: true, force: true });
  await gateway?.stop();
});

/** The one example of docs/frontend.md in `language` that uses `marker` (the page has others). */
function codeBlocks(language, marker) {
  const page = readFileSync(join(ROOT, "docs", "frontend.md"), "utf8");
  const blocks = [...page.matchAll(/```(\w+)\n([\s\S]*?)```/g)]
    .filter((m) => m[1] === language && m[2].includes(marker))
    .map((m) => m[2]);
  assert.equal(blocks.length, 1, `one ${language} example using ${marker} in docs/frontend.md`);
  assert.ok(blocks[0].includes(PLACEHOLDER_URL));
  return blocks[0].replace(PLACEHOLDER_URL, gateway.ws);
}

/** Run a module of WORK in its own Node process; `lines` collects its output. */
function run(file, user, roles, env = {}) {
  const child = spawn(process.execPath, [join(WORK, file)], {
    cwd: PACKAGE,
    env: { ...process.env, GATEWAY_HTTP: gateway.http, TOKEN_USER: user, TOKEN_ROLES: roles, ...env },
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
  writeFileSync(join(WORK, "plain.mjs"), `import "./preamble.mjs";\n${codeBlocks("js", "new GatewayClient(")}`);
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

/** The React example as the page shows it, compiled from TSX (after a strict type-check). */
function reactExample() {
  const source = codeBlocks("tsx", "useThread(");
  writeFileSync(join(WORK, "react-example.tsx"), source);
  const compilerOptions = {
    strict: true,
    noEmit: true,
    jsx: "react-jsx",
    module: "esnext",
    moduleResolution: "bundler",
    target: "ES2022",
    lib: ["ES2022", "DOM"],
    types: [],
    skipLibCheck: true,
  };
  writeFileSync(join(WORK, "tsconfig.json"), JSON.stringify({ compilerOptions, files: ["react-example.tsx"] }));
  const tsc = join(PACKAGE, "node_modules", "typescript", "bin", "tsc");
  try {
    execFileSync(process.execPath, [tsc, "-p", WORK], { encoding: "utf8" });
  } catch (error) {
    assert.fail(`the React example does not type-check:\n${error.stdout}${error.stderr}`);
  }
  return ts.transpileModule(source, {
    compilerOptions: { jsx: ts.JsxEmit.ReactJSX, module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
    fileName: "react-example.tsx",
  }).outputText;
}

// Renders <Chat /> in React's test renderer and drives it as a person would: type and submit,
// press buttons, read what is on screen. An unhandled rejection ends the process with an error.
const REACT_HARNESS = `import "./preamble.mjs";
import { createElement as h } from "react";
import TestRenderer, { act } from "react-test-renderer";
import { Chat } from "./react-example.mjs";

let renderer;
act(() => { renderer = TestRenderer.create(h(Chat, {})); });
const root = () => renderer.root;
const textOf = (node) => node.children.filter((c) => typeof c === "string").join("");
export const until = async (check, what) => {
  const end = Date.now() + 30_000;
  while (!check()) {
    if (Date.now() > end) throw new Error("timed out waiting for " + what);
    await new Promise((r) => setTimeout(r, 20));
  }
};
export const status = () => root().findByType("main").props["data-status"];
export const texts = (kind) => root().findAll((n) => n.type === "div" && n.props.className === kind).map(textOf);
export const button = (label) => root().findAll((n) => n.type === "button" && n.children.includes(label))[0];
export const alert = () => root().findAll((n) => n.type === "p" && n.props.role === "alert").map(textOf)[0] ?? null;
export const send = (value) => act(() => root().findByType("form").props.onSubmit({
  preventDefault() {},
  currentTarget: { elements: { namedItem: () => ({ value }) }, reset() {} },
}));
export const click = (label) => act(() => button(label).props.onClick());
export const report = (result) => { console.log(JSON.stringify(result)); process.exit(0); };
`;

const OWNER = `import { button, report, send, status, texts, until } from "./react-harness.mjs";
const seen = new Set();
await send("tell me a story");
await until(() => { seen.add(texts("message")[0] ?? ""); return status() === "completed"; }, "the story");
await send("refund order 42 for 30 dollars");
await until(() => status() === "waiting_for_review" && texts("approval").length, "the approval");
report({ streamed: seen.size, approvals: texts("approval"), approveShown: Boolean(button("Approve")), stopShown: Boolean(button("Stop")) });
`;

const REVIEWER = `import { alert, button, click, report, send, status, texts, until } from "./react-harness.mjs";
await until(() => button("Approve"), "the approval's buttons");
await click("Approve");
await until(() => status() === "completed", "the refund");
await send("thanks"); // a reviewer may decide here, not add to another user's conversation
await until(() => alert(), "an error on screen");
report({ alert: alert(), approvals: texts("approval"), messages: texts("message") });
`;

// send_email is decided by "either": the run's own user confirms it, no reviewer needed.
const EMAIL = `import { button, click, report, send, status, texts, until } from "./react-harness.mjs";
await send("email bob@example.com about order 5");
await until(() => button("Approve"), "the owner's buttons");
await click("Approve");
await until(() => status() === "completed", "the e-mail");
report({ approvals: texts("approval"), messages: texts("message") });
`;

const RELOADED = `import { button, click, report, send, status, texts, until } from "./react-harness.mjs";
await until(() => status() === "completed" && texts("input").length === 2, "the conversation, again");
const restored = { inputs: texts("input"), approvals: texts("approval") };
await send("tell me another story");
await until(() => button("Stop") && (texts("message").at(-1) ?? "").includes(" "), "the story streaming");
await click("Stop");
await until(() => status() === "cancelled", "the run stopped");
report({ ...restored, notices: texts("notice") });
`;

test("the React example: the owner waits, a reviewer approves, errors show, a reload keeps the thread, the owner confirms an e-mail", async () => {
  writeFileSync(join(WORK, "react-example.mjs"), reactExample());
  writeFileSync(join(WORK, "react-harness.mjs"), REACT_HARNESS);
  const scenario = async (name, source, user, roles, storage) => {
    writeFileSync(join(WORK, `${name}.mjs`), source);
    const child = run(`${name}.mjs`, user, roles, { STORAGE_FILE: join(WORK, storage) });
    const { code, stderr } = await child.exited;
    assert.equal(code, 0, `${name}: ${stderr}\n${child.lines.join("\n")}`);
    return JSON.parse(child.lines.at(-1));
  };

  // The thread's owner (role user) sees the approval wait, with no buttons that would fail.
  const owner = await scenario("owner", OWNER, "uma", "user", "uma.json");
  assert.ok(owner.streamed > 2, "the story was rendered while it streamed");
  assert.deepEqual(owner.approvals, ['issue_refund {"order_id":42,"amount":30}: pending']);
  assert.equal(owner.approveShown, false, "the owner may not approve");
  assert.equal(owner.stopShown, true, "a run waiting for review can be stopped");
  const [threadId] = JSON.parse(readFileSync(join(WORK, "uma.json"), "utf8"))
    .filter(([key]) => key === "chat:thread")
    .map(([, value]) => value);
  assert.match(threadId, /^t_/);

  // A reviewer's tab on the same conversation approves; what fails is on screen, not lost.
  writeFileSync(join(WORK, "rene.json"), JSON.stringify([["chat:thread", threadId]]));
  const reviewer = await scenario("reviewer", REVIEWER, "rene", "reviewer", "rene.json");
  assert.deepEqual(reviewer.approvals, ['issue_refund {"order_id":42,"amount":30}: approved']);
  assert.match(reviewer.messages.at(-1), /Refund of 30\.00 USD issued for order 42/);
  assert.match(reviewer.alert, /\S/, "the refused input's error is shown");

  // The owner reloads: the same conversation comes back; a stopped run says so.
  const reloaded = await scenario("reloaded", RELOADED, "uma", "user", "uma.json");
  assert.deepEqual(reloaded.inputs, ["tell me a story", "refund order 42 for 30 dollars"]);
  assert.deepEqual(reloaded.approvals, reviewer.approvals);
  assert.deepEqual(reloaded.notices, ["Stopped."]);

  const token = await gateway.token("uma");
  const { events } = await gateway.events(threadId, token);
  assert.ok(events.some((e) => e.event === "approval.decided" && e.data.reviewer === "rene" && e.data.decision === "approve"));
  assert.equal(events.filter((e) => e.event === "run.cancelled").length, 1);

  // A call the run's own user may decide: the owner gets the buttons and approves it.
  const email = await scenario("email", EMAIL, "uma", "user", "uma-email.json");
  assert.deepEqual(email.approvals.map((text) => text.replace(/ \{.*\}/, "")), ["send_email: approved"]);
  assert.match(email.messages.at(-1), /Email sent to bob@example\.com/);
});
