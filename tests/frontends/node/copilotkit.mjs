// CopilotKit's own agent class (@copilotkit/core's ProxiedCopilotRuntimeAgent, on the
// @ag-ui/client 0.0.59 it ships with) with its runtimeUrl pointing at the gateway: /info, a run,
// an interrupt answered as CopilotKit's useInterrupt does (ɵInterruptState: a synthetic tool
// message and a resume under the interrupted run's runId), a connect after a thread switch, and
// a stop through abortRun(); then the single-route transport. Or (scenario "cancelWhilePaused")
// a run stopped while it waits for a decision, and a new message after it.
// Config (argv[2], JSON): {scenario?, runtimeUrl, token, threadId, input, storyThreadId, story}.

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

const scenarios = {
  // /info, a run, an interrupt answered as useInterrupt does, a connect after a thread
  // switch, a stop, and the single-route transport.
  async tour() {
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
  },

  // A run stopped while it waits for a decision (the stop route CopilotKit calls), then a new
  // message: from the same agent, which still holds the interrupts and cancels them as
  // useInterrupt does; and from a fresh agent that replays the thread (a reload).
  async cancelWhilePaused() {
    const results = {};
    for (const reload of [false, true]) {
      const threadId = `${config.threadId}-${reload ? "reload" : "same"}`;
      const chat = agent(threadId, "rest");
      chat.setMessages([{ id: randomUUID(), role: "user", content: config.input }]);
      const runId = randomUUID();
      await chat.runAgent({ runId });
      const held = chat.pendingInterrupts.length;
      const stop = await fetch(`${config.runtimeUrl}/agent/assistant/stop/${threadId}`, {
        method: "POST",
        headers: { Authorization: `Bearer ${config.token}`, "Content-Type": "application/json" },
        body: JSON.stringify({ runId }),
      });
      const stopped = await stop.json();
      let next = chat;
      if (reload) {
        next = agent(threadId, "rest");
        next.setMessages([]);
        await next.connectAgent();
      } else {
        const interrupts = new ɵInterruptState();
        interrupts.setStandard(chat.pendingInterrupts);
        const decision = interrupts.cancel();
        if (decision.kind !== "resume") throw new Error(`useInterrupt would not resume: ${decision.kind}`);
        chat.setMessages([
          ...chat.messages,
          ...decision.toolResults.map((r) => ({ id: randomUUID(), role: "tool", toolCallId: r.toolCallId, content: r.content })),
        ]);
        await chat.runAgent({ resume: decision.resume, runId });
      }
      const cleared = summary(next);
      next.setMessages([...next.messages, { id: randomUUID(), role: "user", content: "hello again" }]);
      let error = null;
      await next.runAgent({ runId: randomUUID() }).catch((e) => (error = String(e?.message ?? e)));
      results[reload ? "reload" : "same"] = { held, stopped, cleared, after: { ...summary(next), error } };
    }
    emit("done", results);
  },
};

try {
  await scenarios[config.scenario ?? "tour"]();
} catch (error) {
  emit("failed", { message: String(error?.stack ?? error) });
}
process.exit(0);
