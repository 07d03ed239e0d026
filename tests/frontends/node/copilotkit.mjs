// CopilotKit's own agent class (@copilotkit/core's ProxiedCopilotRuntimeAgent, on the
// @ag-ui/client 0.0.59 it ships with) with its runtimeUrl pointing at the gateway: /info, a run,
// an interrupt answered as CopilotKit's useInterrupt does (ɵInterruptState: a synthetic tool
// message and a resume under the interrupted run's runId), a connect after a thread switch, and
// a stop through abortRun(); then the single-route transport.
// Config (argv[2], JSON): {runtimeUrl, token, threadId, input, storyThreadId, story}.

import { randomUUID } from "node:crypto";

import { ProxiedCopilotRuntimeAgent, ɵInterruptState } from "@copilotkit/core";

const config = JSON.parse(process.argv[2]);

function emit(event, data = {}) {
  process.stdout.write(JSON.stringify({ event, ...data }) + "\n");
}

function agent(threadId, transport = "auto") {
  const made = new ProxiedCopilotRuntimeAgent({
    runtimeUrl: config.runtimeUrl,
    agentId: "assistant",
    headers: { Authorization: `Bearer ${config.token}` },
    transport,
  });
  made.threadId = threadId;
  made.seen = [];
  made.subscribe({ onEvent: ({ event }) => made.seen.push(event) });
  return made;
}

function summary(target) {
  return {
    messages: target.messages,
    types: target.seen.map((e) => e.type),
    pendingInterrupts: target.pendingInterrupts,
    finished: target.seen.filter((e) => e.type === "RUN_FINISHED" || e.type === "RUN_ERROR"),
  };
}

try {
  const info = await (
    await fetch(`${config.runtimeUrl}/info`, { headers: { Authorization: `Bearer ${config.token}` } })
  ).json();
  emit("info", { info });

  const chat = agent(config.threadId);
  chat.setMessages([{ id: randomUUID(), role: "user", content: config.input }]);
  const runId = randomUUID();
  await chat.runAgent({ runId });
  emit("interrupted", summary(chat));

  const interrupts = new ɵInterruptState();
  interrupts.setStandard(chat.pendingInterrupts);
  const decision = interrupts.resolve({ approved: true });
  if (decision.kind !== "resume") throw new Error(`useInterrupt would not resume: ${decision.kind}`);
  chat.setMessages([
    ...chat.messages,
    ...decision.toolResults.map((r) => ({ id: randomUUID(), role: "tool", toolCallId: r.toolCallId, content: r.content })),
  ]);
  await chat.runAgent({ resume: decision.resume, runId });
  emit("resumed", { ...summary(chat), runId });

  // A thread switch: CopilotKit empties the agent and connects (a replay of the whole thread).
  const other = agent(config.threadId);
  other.setMessages([]);
  await other.connectAgent();
  emit("connected", summary(other));

  // Stop: CopilotKit's abortRun() asks the runtime to stop the thread's run.
  const story = agent(config.storyThreadId);
  story.setMessages([{ id: randomUUID(), role: "user", content: config.story }]);
  let contents = 0;
  story.subscribe({
    onTextMessageContentEvent: () => {
      contents += 1;
      if (contents === 5) story.abortRun();
    },
  });
  await story.runAgent({ runId: randomUUID() }).catch((error) => emit("run-error", { message: String(error) }));
  emit("stopped", { story: summary(story) });

  // The single-route transport: one POST to runtimeUrl for every operation.
  const single = agent(config.singleThreadId, "single");
  single.setMessages([{ id: randomUUID(), role: "user", content: "hello there" }]);
  await single.runAgent({ runId: randomUUID() });
  const rejoined = agent(config.singleThreadId, "single");
  await rejoined.connectAgent();
  emit("done", { single: summary(single), rejoined: summary(rejoined) });
} catch (error) {
  emit("failed", { message: String(error?.stack ?? error) });
}
process.exit(0);
