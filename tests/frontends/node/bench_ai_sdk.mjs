// Timings for bench/ai_sdk.py, taken where an app sees the AI SDK's chunks: when @ai-sdk/react's
// `Chat` (what useChat instantiates) has applied them to its messages, over WebSocketChatTransport
// or DefaultChatTransport (HTTP), beside a plain `ws` client of the native protocol parsing event
// frames. Config (argv[2], JSON): {scenario: "latency" | "resume", base, wsUrl, token, ...};
// prints one JSON line.

import { randomUUID } from "node:crypto";

import { Chat } from "@ai-sdk/react";
import { DefaultChatTransport, WebSocketChatTransport } from "ai";
import WebSocket from "ws";

import { nativeDeltas, nativeReplay, now, report } from "./bench_native.mjs";

const config = JSON.parse(process.argv[2]);
const headers = { authorization: `Bearer ${config.token}` };

function transport(kind) {
  return kind === "ws"
    ? new WebSocketChatTransport({
        url: `${config.base.replace(/^http/, "ws")}/v1/ai-sdk/ws`,
        headers,
        webSocket: WebSocket,
      })
    : new DefaultChatTransport({ api: `${config.base}/v1/ai-sdk/chat`, headers });
}

const textLength = (message) =>
  message.parts.reduce((n, part) => n + (part.type === "text" ? part.text.length : 0), 0);

// A Chat whose message changes are watched as useChat watches them (the state's messages
// callback, unthrottled): each text delta applied is recorded with the `seq` of its stored event.
// Every stored event's chunks are followed by a `message-metadata` {seq} chunk, so the time
// the text grew is attributed to the seq the metadata names next.
function watchedChat(kind, chatId) {
  const link = transport(kind);
  const chat = new Chat({ id: chatId, transport: link });
  const watch = { seen: [], firstAt: null, length: 0, seq: null, grewAt: null };
  chat["~registerMessagesCallback"](() => {
    const at = now();
    watch.firstAt ??= at;
    const message = chat.messages.at(-1);
    if (message?.role !== "assistant") return;
    const length = textLength(message);
    if (length !== watch.length) {
      watch.length = length;
      watch.grewAt = at;
    }
    const seq = message.metadata?.seq;
    if (seq !== watch.seq) {
      watch.seq = seq;
      if (watch.grewAt !== null) watch.seen.push([seq, watch.grewAt]);
      watch.grewAt = null;
    }
  });
  return { chat, watch, close: () => link.close?.() };
}

function summary(chat) {
  const message = chat.messages.at(-1);
  return {
    status: chat.status,
    error: chat.error ? String(chat.error.message ?? chat.error) : null,
    role: message?.role ?? null,
    chars: message ? textLength(message) : 0,
    seq: message?.metadata?.seq ?? null,
    parts: message?.parts.length ?? 0,
  };
}

async function chatDeltas(kind) {
  const chatId = `bench-${randomUUID()}`;
  const { chat, watch, close } = watchedChat(kind, chatId);
  await chat.sendMessage({ text: config.input });
  const result = summary(chat);
  close();
  if (result.status !== "ready") throw new Error(`${kind}: ${JSON.stringify(result)}`);
  return { threadId: chatId, seen: watch.seen };
}

// Rounds rotate the order of the three clients, so none always runs first (or right after the
// same neighbour).
function rotated(kinds, round) {
  return kinds.map((_, i) => kinds[(i + round) % kinds.length]);
}

const scenarios = {
  async latency() {
    const out = { ws: [], http: [], native: [] };
    for (let round = 0; round < config.rounds; round += 1) {
      for (const kind of rotated(Object.keys(out), round)) {
        out[kind].push(
          kind === "native"
            ? await nativeDeltas(config.wsUrl, config.token, config.input)
            : await chatDeltas(kind),
        );
      }
    }
    return out;
  },

  async resume() {
    // A Chat that holds nothing (a reloaded page) calls resumeStream() on the chat of a long
    // response: ms until the promise settles with the message rebuilt, and until the first
    // change of the messages. Beside it, the native client reading the same run from seq 0.
    const out = { ws: [], http: [], native: [] };
    for (let round = 0; round < config.rounds; round += 1) {
      for (const kind of rotated(Object.keys(out), round)) {
        if (kind === "native") {
          out.native.push(await nativeReplay(config.wsUrl, config.token, config.chatId));
          continue;
        }
        const { chat, watch, close } = watchedChat(kind, config.chatId);
        const begin = now();
        await chat.resumeStream();
        const end = now();
        const result = summary(chat);
        close();
        if (result.status !== "ready" || result.chars !== config.chars) {
          throw new Error(`${kind}: ${JSON.stringify(result)}`);
        }
        out[kind].push({ ms: end - begin, firstMs: watch.firstAt - begin, ...result });
      }
    }
    return out;
  },
};

report(await scenarios[config.scenario]());
