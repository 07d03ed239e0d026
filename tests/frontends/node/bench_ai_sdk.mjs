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

// `ws` offers permessage-deflate by default, as browsers do, and the gateway accepts it; the
// "plain" kinds turn it off, to tell its cost (both ends, per frame) from the rest.
class PlainWebSocket extends WebSocket {
  constructor(url, protocols) {
    super(url, protocols, { perMessageDeflate: false });
  }
}

const aiSdkWs = () => `${config.base.replace(/^http/, "ws")}/v1/ai-sdk/ws`;

function transport(kind) {
  if (kind === "http") return new DefaultChatTransport({ api: `${config.base}/v1/ai-sdk/chat`, headers });
  const webSocket = kind === "wsPlain" ? PlainWebSocket : WebSocket;
  return new WebSocketChatTransport({ url: aiSdkWs(), headers, webSocket });
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

async function resumeOnce(kind) {
  if (kind === "native") return nativeReplay(config.wsUrl, config.token, config.chatId);
  if (kind === "rawHttp") return rawHttp();
  if (kind === "rawWs") return rawWs(WebSocket);
  if (kind === "rawWsPlain") return rawWs(PlainWebSocket);
  const { chat, watch, close } = watchedChat(kind, config.chatId);
  const begin = now();
  await chat.resumeStream();
  const end = now();
  const result = summary(chat);
  close();
  if (result.status !== "ready" || result.chars !== config.chars) {
    throw new Error(`${kind}: ${JSON.stringify(result)}`);
  }
  return { ms: end - begin, firstMs: watch.firstAt - begin, ...result };
}

// The resume's response read whole with fetch, chunks counted, nothing parsed.
async function rawHttp() {
  const begin = now();
  const response = await fetch(`${config.base}/v1/ai-sdk/chat/${config.chatId}/stream`, { headers });
  const text = await response.text();
  const ms = now() - begin;
  return { ms, chunks: text.match(/^data: \{/gm)?.length ?? 0 };
}

// A `resume` on a new socket of class `Socket` (as the transport would open it), every frame
// parsed, to `end`.
function rawWs(Socket) {
  const begin = now();
  const ws = new Socket(aiSdkWs());
  let chunks = 0;
  return new Promise((resolve, reject) => {
    ws.on("error", reject);
    ws.on("open", () =>
      ws.send(JSON.stringify({ type: "resume", requestId: "raw", id: config.chatId, headers, body: {} })),
    );
    ws.on("message", (raw) => {
      const frame = JSON.parse(raw.toString());
      if (frame.type === "chunk") chunks += 1;
      if (frame.type === "end") {
        const ms = now() - begin;
        ws.close();
        resolve({ ms, chunks });
      }
    });
  });
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
    // change of the messages. Beside it, in the same rounds: the native client reading the same
    // run from seq 0, and the two AI SDK responses read raw (same sockets and fetch, no Chat).
    // One unmeasured round first: the first resume of a process runs on cold code.
    const kinds = ["ws", "http", "native", "rawWs", "rawHttp", "wsPlain", "rawWsPlain"];
    const out = { cold: {}, ...Object.fromEntries(kinds.map((kind) => [kind, []])) };
    for (const kind of kinds) out.cold[kind] = (await resumeOnce(kind)).ms;
    for (let round = 0; round < config.rounds; round += 1) {
      for (const kind of rotated(kinds, round)) out[kind].push(await resumeOnce(kind));
    }
    return out;
  },
};

report(await scenarios[config.scenario]());
