// Drives assistant-ui's AI SDK adapter (@assistant-ui/react-ai-sdk) against a running gateway,
// rendered by react-test-renderer in Node and used through assistant-ui's runtime API (what its
// components call: append, respond to a tool approval, cancel). Either of its two entry points:
// `useAISDKRuntime` over the app's own `useChat` (the app names the chat), or `useChatRuntime`
// (assistant-ui makes the chat, with its own thread id, over AssistantChatTransport).
// Run by tests/frontends/test_assistant_ui.py:
//
//   node assistant_ui.mjs '<json config>'
//
// config: {scenario, runtime?: "useAISDKRuntime"|"useChatRuntime", transport: "http"|"ws", base,
//          token, chatId, text, stopAfterChars?, messages?, resume?}
// Prints one JSON object per line: progress ({"event": ...}) and, last, {"event":"done", ...}
// with assistant-ui's thread messages and the AI SDK chat's own messages.

import { useChat } from "@ai-sdk/react";
// The provider comes with the adapter (its core); @assistant-ui/react's own re-export of it
// brings the DOM components, which Node has no use for.
import { AssistantRuntimeProvider } from "@assistant-ui/core/react";
import {
  AssistantChatTransport,
  useAISDKChat,
  useAISDKRuntime,
  useChatRuntime,
} from "@assistant-ui/react-ai-sdk";
import {
  DefaultChatTransport,
  WebSocketChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";
import React from "react";
import TestRenderer from "react-test-renderer";
import WebSocket from "ws";

const config = JSON.parse(process.argv[2]);
const emit = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);
const headers = { authorization: `Bearer ${config.token}` };

const chatRuntime = config.runtime === "useChatRuntime";
const transport =
  config.transport === "ws"
    ? new WebSocketChatTransport({
        url: `${config.base.replace(/^http/, "ws")}/v1/ai-sdk/ws`,
        headers,
        webSocket: WebSocket,
      })
    : chatRuntime
      ? new AssistantChatTransport({ api: `${config.base}/v1/ai-sdk/chat`, headers })
      : new DefaultChatTransport({ api: `${config.base}/v1/ai-sdk/chat`, headers });

const held = { chat: null, runtime: null };

// useChatRuntime: assistant-ui holds the useChat; its helpers are read inside the provider.
function ChatProbe() {
  held.chat = useAISDKChat();
  return null;
}
function ChatRuntimeHarness() {
  held.runtime = useChatRuntime({
    transport,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
  return React.createElement(
    AssistantRuntimeProvider,
    { runtime: held.runtime },
    React.createElement(ChatProbe),
  );
}

// useAISDKRuntime: useChat as any useChat app has it, and assistant-ui's runtime over it.
function Harness() {
  held.chat = useChat({
    id: config.chatId,
    transport,
    messages: config.messages ?? [],
    resume: config.resume === true,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: (error) => emit({ event: "error", message: String(error?.message ?? error) }),
  });
  held.runtime = useAISDKRuntime(held.chat);
  return React.createElement(AssistantRuntimeProvider, { runtime: held.runtime });
}

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

const thread = () => held.runtime.thread;
const threadMessages = () => thread().getState().messages;
const lastAssistant = () => threadMessages().filter((m) => m.role === "assistant").at(-1);
const toolCalls = () => (lastAssistant()?.content ?? []).filter((p) => p.type === "tool-call");
const textOf = (message) =>
  (message?.content ?? [])
    .filter((p) => p.type === "text")
    .map((p) => p.text)
    .join("");
const idle = () => !thread().getState().isRunning && held.chat.status !== "submitted";

async function settled() {
  // isRunning goes true once the request starts; the automatic follow-up after an approval
  // starts a moment after the first response ends.
  await until(idle);
  await new Promise((resolve) => setTimeout(resolve, 100));
  await until(idle);
}

function done(extra = {}) {
  emit({
    event: "done",
    status: held.chat.status,
    error: held.chat.error ? String(held.chat.error.message ?? held.chat.error) : null,
    thread: threadMessages().map((m) => ({
      id: m.id,
      role: m.role,
      status: m.status?.type ?? null,
      text: textOf(m),
      content: m.content,
    })),
    messages: held.chat.messages,
    // The chat's id as the adapter sent it: assistant-ui's own thread id under useChatRuntime.
    threadId: thread().getState().threadId,
    ...extra,
  });
}

const scenarios = {
  async stream() {
    thread().append({ role: "user", content: [{ type: "text", text: config.text }] });
    await until(() => thread().getState().isRunning);
    await settled();
    done();
  },

  async approve() {
    // assistant-ui's approve button: the tool call part's respondToToolApproval.
    thread().append({ role: "user", content: [{ type: "text", text: config.text }] });
    await until(() => toolCalls().some((p) => p.approval && p.approval.approved === undefined));
    await until(idle);
    const part = toolCalls().find((p) => p.approval && p.approval.approved === undefined);
    emit({ event: "approval", approval: part.approval, status: lastAssistant().status });
    await thread()
      .getMessageById(lastAssistant().id)
      .getMessagePartByToolCallId(part.toolCallId)
      .respondToToolApproval({ approved: config.approve !== false, reason: config.reason });
    await until(() => thread().getState().isRunning);
    await settled();
    done();
  },

  async resume() {
    // Mounted with resume: true on a chat whose run is active (a reload): the adapter shows
    // the rejoined response.
    await until(() => thread().getState().isRunning);
    emit({ event: "rejoined", text: textOf(lastAssistant()) });
    await settled();
    done();
  },

  async stop() {
    // assistant-ui's stop button: cancelRun, which stops the useChat request.
    thread().append({ role: "user", content: [{ type: "text", text: config.text }] });
    await until(() => textOf(lastAssistant()).length >= config.stopAfterChars);
    thread().cancelRun();
    if (config.transport !== "ws") {
      // Over HTTP, stop() only aborts the fetch: the app calls the gateway's stop endpoint.
      const answer = await fetch(`${config.base}/v1/ai-sdk/chat/${config.chatId}/stop`, {
        method: "POST",
        headers,
      });
      emit({ event: "stopped", status: answer.status, body: await answer.json() });
    }
    await settled();
    // The transport sends `abort` on its own schedule: let it leave before this process does.
    await new Promise((resolve) => setTimeout(resolve, 200));
    done();
  },
};

const renderer = TestRenderer.create(
  React.createElement(chatRuntime ? ChatRuntimeHarness : Harness),
);
try {
  await until(() => held.runtime !== null && held.chat);
  await scenarios[config.scenario]();
} catch (error) {
  emit({ event: "failed", message: String(error?.stack ?? error) });
  done();
}
renderer.unmount();
transport.close?.();
process.exit(0);
