// Runs the useChat example of docs/frontend.md ("Vercel AI SDK") as it is on the page: the TSX
// compiled by esbuild, its `Chat` rendered by react-test-renderer in Node and used as a person
// would (the buttons' onClick), against a running gateway. Run by
// tests/frontends/test_ai_sdk_docs.py:
//
//   node ai_sdk_docs.mjs '<json config>'
//
// config: {source (the page's TSX, its GATEWAY pointed at the gateway), token, chatId}
// Prints one JSON object per line: what the page shows at each step ({"event": ...}). Reads
// one JSON line on stdin before it clicks "Ask" and after it saw a wait for a reviewer.

import { randomUUID } from "node:crypto";
import { rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { transform } from "esbuild";
import React from "react";
import TestRenderer from "react-test-renderer";
import WebSocket from "ws";

const config = JSON.parse(process.argv[2]);
const emit = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);
// A browser's WebSocket; Node 20 has none of its own.
globalThis.WebSocket ??= WebSocket;

const { code } = await transform(config.source, {
  loader: "tsx",
  jsx: "automatic",
  format: "esm",
});
// Beside node_modules, so the example's imports resolve to the pinned packages.
const module = join(dirname(fileURLToPath(import.meta.url)), `.docs-ai-sdk-${randomUUID()}.mjs`);
await writeFile(module, code);
let example;
try {
  example = await import(pathToFileURL(module).href);
} finally {
  await rm(module, { force: true });
}

function until(predicate, timeoutMs = 20000) {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const check = () => {
      const value = predicate();
      if (value) resolve(value);
      else if (Date.now() - started > timeoutMs) reject(new Error("timed out waiting"));
      else setTimeout(check, 5);
    };
    check();
  });
}

const readLine = () =>
  new Promise((resolve) => process.stdin.once("data", (data) => resolve(String(data))));

const textOf = (node) =>
  typeof node === "string" ? node : (node.children ?? []).map(textOf).join("");

let renderer;
const paragraphs = () => renderer.root.findAllByType("p").map(textOf).filter(Boolean);
const button = (label) =>
  renderer.root.findAll((node) => node.type === "button" && textOf(node) === label)[0];
const shown = () => ({ paragraphs: paragraphs(), buttons: renderer.root.findAllByType("button").map(textOf) });

try {
  const initialMessages = await example.loadMessages(config.chatId, config.token);
  renderer = TestRenderer.create(
    React.createElement(example.Chat, { chatId: config.chatId, token: config.token, initialMessages }),
  );
  emit({ event: "loaded", messages: initialMessages, ...shown() });
  await readLine();
  button("Ask").props.onClick();
  const decision = await until(() => button("Approve") || paragraphs().includes("Waiting for a reviewer…"));
  emit({ event: "asked", ...shown() });
  if (decision === true) await readLine(); // a reviewer decides elsewhere
  else button("Approve").props.onClick();
  // The same message goes on to the answer; the page is ready for the next question.
  await until(() => paragraphs().some((p) => p.startsWith("Here is what happened")) && button("Ask"));
  emit({ event: "done", ...shown() });
} catch (error) {
  emit({ event: "failed", message: String(error?.stack ?? error), ...(renderer ? shown() : {}) });
}
renderer?.unmount();
process.exit(0);
