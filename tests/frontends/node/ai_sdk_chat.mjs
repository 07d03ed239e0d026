// Drives the AI SDK's own `Chat` (what `useChat` instantiates, from @ai-sdk/react) over its real
// transports against a running gateway: DefaultChatTransport (HTTP) or WebSocketChatTransport.
// Run by tests/frontends/test_ai_sdk.py:
//
//   node ai_sdk_chat.mjs '<json config>'
//
// config: {scenario, transport: "http"|"ws", base, token, chatId, text, dropAfter?, stopAfter?,
//          approve?, reason?, messages?}
// Prints one JSON object per line: progress ({"event": ...}) and, last, {"event":"done", ...}
// with the chat's messages, its status and error, and what went over the wire.

import { Chat } from "@ai-sdk/react";
import {
  DefaultChatTransport,
  WebSocketChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";
import WebSocket from "ws";

const config = JSON.parse(process.argv[2]);
const emit = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);
const headers = { authorization: `Bearer ${config.token}` };
const wire = { requests: [], chunks: 0, sockets: 0 };

// A connection that can be cut from below, as a lost network would: the WebSocket is
// terminated without a close handshake, the HTTP body errors with a network TypeError.
// After a cut, new connections go to `config.resumeBase` when given: another gateway process.
const cut = { armed: false, after: Infinity, seen: 0, sockets: new Set(), happened: false };

function redirected(url) {
  if (!cut.happened || !config.resumeBase) return url;
  const target = new URL(config.resumeBase);
  const moved = new URL(String(url));
  moved.host = target.host;
  return moved;
}

function countChunk() {
  cut.seen += 1;
  if (cut.armed && cut.seen >= cut.after) {
    cut.armed = false;
    cut.happened = true;
    return true;
  }
  return false;
}

class CuttableWebSocket extends WebSocket {
  constructor(url, protocols) {
    super(redirected(url), protocols);
    wire.sockets += 1;
    cut.sockets.add(this);
    this.addEventListener("message", (event) => {
      const frame = JSON.parse(String(event.data));
      if (frame.type === "chunk") {
        wire.chunks += 1;
        if (countChunk()) {
          emit({ event: "cut", after: cut.seen });
          this.terminate();
        }
      }
    });
  }
  send(data) {
    wire.requests.push(JSON.parse(String(data)).type);
    super.send(data);
  }
}

async function cuttableFetch(input, init) {
  const url = redirected(input);
  wire.requests.push(`${init?.method ?? "GET"} ${new URL(String(url)).host} ${new URL(String(url)).pathname}`);
  const response = await fetch(url, init);
  if (!response.body) return response;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let failed = false;
  const body = new ReadableStream({
    async pull(controller) {
      if (failed) return;
      const { done, value } = await reader.read();
      if (done) {
        controller.close();
        return;
      }
      const text = decoder.decode(value, { stream: true });
      let cutNow = false;
      for (const _ of text.matchAll(/^data: \{/gm)) {
        wire.chunks += 1;
        if (countChunk()) cutNow = true;
      }
      controller.enqueue(value);
      if (cutNow) {
        failed = true;
        emit({ event: "cut", after: cut.seen });
        reader.cancel().catch(() => {});
        controller.error(new TypeError("network error"));
      }
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: response.status, headers: response.headers });
}

const transport =
  config.transport === "ws"
    ? new WebSocketChatTransport({
        url: `${config.base.replace(/^http/, "ws")}/v1/ai-sdk/ws`,
        headers,
        webSocket: CuttableWebSocket,
      })
    : new DefaultChatTransport({
        api: `${config.base}/v1/ai-sdk/chat`,
        headers,
        fetch: cuttableFetch,
      });

const chat = new Chat({
  id: config.chatId,
  transport,
  messages: config.messages ?? [],
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  onError: (error) => emit({ event: "error", message: String(error?.message ?? error) }),
});

function until(predicate, timeoutMs = 20000) {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const check = () => {
      let value;
      try {
        value = predicate();
      } catch (error) {
        reject(error);
        return;
      }
      if (value) resolve(value);
      else if (Date.now() - started > timeoutMs) reject(new Error("timed out waiting"));
      else setTimeout(check, 5);
    };
    check();
  });
}

const lastAssistant = () => chat.messages.filter((m) => m.role === "assistant").at(-1);
const toolParts = () => (lastAssistant()?.parts ?? []).filter((p) => p.type.startsWith("tool-"));
const settled = () => chat.status === "ready" || chat.status === "error";

async function finished() {
  // Status goes to "submitted" synchronously in sendMessage; wait for the end of all
  // requests, automatic follow-ups included.
  await until(() => settled() && !chat["~isSending"]);
  await new Promise((resolve) => setTimeout(resolve, 50));
  await until(settled);
}

function done(extra = {}) {
  emit({
    event: "done",
    status: chat.status,
    error: chat.error ? String(chat.error.message ?? chat.error) : null,
    messages: chat.messages,
    wire,
    ...extra,
  });
}

async function readLine() {
  // The test's next instruction, one JSON line on stdin.
  return new Promise((resolve) => {
    process.stdin.once("data", (data) => resolve(JSON.parse(String(data).trim())));
  });
}

const scenarios = {
  async stream() {
    await chat.sendMessage({ text: config.text });
    await finished();
    done();
  },

  async approve() {
    // The run's own user decides the call inline; the follow-up request goes by itself.
    await chat.sendMessage({ text: config.text });
    await until(() => settled() && toolParts().some((p) => p.state === "approval-requested"));
    const part = toolParts().find((p) => p.state === "approval-requested");
    emit({ event: "approval", approvalId: part.approval.id, descriptor: part.approval.descriptor });
    const forged = config.forge ? `${part.approval.id}x` : part.approval.id;
    chat.addToolApprovalResponse({ id: forged, approved: config.approve !== false, reason: config.reason });
    await until(() => chat.status !== "ready");
    await finished();
    done();
  },

  async reviewer() {
    // Only a reviewer decides: the response stays open, and the continuation arrives in it.
    const sent = chat.sendMessage({ text: config.text });
    await until(() => toolParts().some((p) => p.state === "approval-requested"));
    const part = toolParts().find((p) => p.state === "approval-requested");
    if (config.dropWhileWaiting) {
      // The first chunk of the continuation finds the connection gone.
      cut.armed = true;
      cut.after = cut.seen + 1;
    }
    emit({ event: "approval", approvalId: part.approval.id, status: chat.status, descriptor: part.approval.descriptor });
    if (config.dropWhileWaiting) {
      await readLine(); // decided
      await until(settled);
      emit({ event: "dropped", status: chat.status });
      await chat.resumeStream();
    } else {
      await readLine();
    }
    await sent;
    await finished();
    done();
  },

  async mixed() {
    // A pause with a call the user decides beside one only a reviewer decides: the response
    // ends, the user answers theirs, and the answer's response follows the run while the
    // reviewer decides. The stock predicate waits for every call, the reviewer's too, so the
    // app sends the answer itself with sendMessage().
    await chat.sendMessage({ text: config.text });
    await until(() => settled() && toolParts().some((p) => p.state === "approval-requested"));
    const calls = () =>
      toolParts().map((p) => ({ type: p.type, state: p.state, canDecide: p.approval?.descriptor?.canDecide }));
    emit({ event: "paused", status: chat.status, calls: calls() });
    const mine = toolParts().filter((p) => p.approval?.descriptor?.canDecide);
    for (const part of mine) chat.addToolApprovalResponse({ id: part.approval.id, approved: true });
    const sent = chat.sendMessage();
    await until(() => chat.status === "streaming");
    emit({ event: "answered", status: chat.status, calls: calls() });
    await readLine(); // the reviewer decided
    await sent;
    await finished();
    done();
  },

  async dropResume() {
    // The connection is cut mid-stream; resumeStream() rebuilds the message from the log.
    // Cut here after `dropAfter` chunks, or (without it) by the gateway process dying.
    cut.armed = config.dropAfter != null;
    cut.after = config.dropAfter ?? Infinity;
    if (config.announceStreaming) {
      const announce = () =>
        cut.seen >= config.announceStreaming
          ? emit({ event: "streaming", chunks: cut.seen })
          : setTimeout(announce, 5);
      announce();
    }
    await chat.sendMessage({ text: config.text }).catch(() => {});
    await until(settled);
    cut.happened = true;
    emit({ event: "dropped", status: chat.status, partial: lastAssistant()?.parts });
    if (config.pauseBeforeResume) await readLine();
    await chat.resumeStream();
    await finished();
    done();
  },

  async regenerate() {
    // regenerate() replaces the last answer; sendMessage with a user message's id edits it.
    await chat.sendMessage({ text: config.text });
    await finished();
    emit({ event: "answered", messages: chat.messages });
    await chat.regenerate();
    await finished();
    emit({ event: "regenerated", messages: chat.messages });
    const user = chat.messages.find((m) => m.role === "user");
    await chat.sendMessage({ text: config.edited, messageId: user.id });
    await finished();
    done();
  },

  async editEarlier() {
    // Turns of `texts`, then an edit of the first user message (useChat drops what follows it).
    for (const text of config.texts) {
      await chat.sendMessage({ text });
      await finished();
    }
    emit({ event: "answered", messages: chat.messages });
    const first = chat.messages.find((m) => m.role === "user");
    await chat.sendMessage({ text: config.edited, messageId: first.id });
    await finished();
    done();
  },

  async regenerateFromInput() {
    // Turns of `texts` (none: the chat's `messages` as given), then regenerate({messageId}) of
    // the last user message: useChat keeps that message and sends its id.
    for (const text of config.texts) {
      await chat.sendMessage({ text });
      await finished();
    }
    const last = chat.messages.filter((m) => m.role === "user").at(-1);
    await chat.regenerate({ messageId: last.id });
    await finished();
    done({ regeneratedFrom: last.id });
  },

  async resumeIdle() {
    // Nothing active: resumeStream() changes nothing.
    await chat.resumeStream();
    await finished();
    done();
  },

  async stop() {
    // stop(): the WebSocket transport sends `abort`; over HTTP the app calls the stop endpoint.
    cut.after = Infinity;
    const sent = chat.sendMessage({ text: config.text });
    await until(() => cut.seen >= config.stopAfter);
    if (config.transport !== "ws") {
      const answer = await fetch(`${config.base}/v1/ai-sdk/chat/${config.chatId}/stop`, {
        method: "POST",
        headers,
      });
      emit({ event: "stopped", status: answer.status, body: await answer.json() });
    }
    await chat.stop();
    await sent.catch(() => {});
    await until(settled);
    // The transport sends `abort` on its own schedule: let it leave before this process does.
    await new Promise((resolve) => setTimeout(resolve, 200));
    done({ partial: lastAssistant()?.parts });
  },
};

try {
  await scenarios[config.scenario]();
} catch (error) {
  emit({ event: "failed", message: String(error?.stack ?? error) });
  done();
}
for (const socket of cut.sockets) socket.terminate();
transport.close?.();
process.exit(0);
