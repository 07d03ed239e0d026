// Drives the real @ag-ui/client HttpAgent (1.0.0, or 0.0.59 as CopilotKit ships it) against a
// gateway, through the JavaScript client package's GatewayAgent (client_demo/js/src/ag-ui-agent.js).
// Config (argv[2], JSON): {scenario, url, token, threadId, version, input, ...}. Prints one
// JSON line per step ({"event": ...}); reads JSON lines on stdin where a test acts meanwhile.

import { createInterface } from "node:readline";

import { makeGatewayAgent } from "../../../client_demo/js/src/ag-ui-agent.js";

const config = JSON.parse(process.argv[2]);
const agui = config.version === "0.0.59" ? await import("ag-ui-client-0059") : await import("@ag-ui/client");
const GatewayAgent = makeGatewayAgent(agui);

function emit(event, data = {}) {
  process.stdout.write(JSON.stringify({ event, ...data }) + "\n");
}

// @ag-ui/client 1.0.0 re-throws a cut stream's error inside reader.cancel().catch(): an
// unhandled rejection, not the run's failure. Reported, not fatal.
process.on("unhandledRejection", (error) => emit("unhandled", { message: String(error?.message ?? error) }));

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function told() {
  const { value, done } = await lines.next();
  if (done) throw new Error("stdin closed");
  return JSON.parse(value);
}

function agent(url = config.url, extra = {}) {
  const made = new GatewayAgent({
    url,
    threadId: config.threadId,
    headers: { Authorization: `Bearer ${config.token}` },
    ...extra,
  });
  made.seen = [];
  made.subscribe({ onEvent: ({ event }) => made.seen.push(event) });
  return made;
}

function say(target, text) {
  target.messages = [...target.messages, { id: agui.randomUUID ? agui.randomUUID() : crypto.randomUUID(), role: "user", content: text }];
}

function summary(target) {
  return {
    messages: target.messages,
    types: target.seen.map((e) => e.type),
    lastEventId: target.lastEventId,
    pendingInterrupts: target.pendingInterrupts,
    finished: target.seen.filter((e) => e.type === "RUN_FINISHED" || e.type === "RUN_ERROR"),
  };
}

async function settle(promise) {
  try {
    return { result: await promise };
  } catch (error) {
    return { error: String(error?.message ?? error) };
  }
}

function contentCounter(target, count, then) {
  let seen = 0;
  target.subscribe({
    onTextMessageContentEvent: () => {
      seen += 1;
      if (seen === count) then();
    },
  });
}

const scenarios = {
  async text() {
    const runner = agent();
    say(runner, config.input);
    const outcome = await settle(runner.runAgent({ runId: config.runId }));
    const ran = summary(runner);
    // A clone (CopilotKit clones agents) keeps the cursor and then tracks its own.
    const twin = runner.clone();
    const twinCursor = twin.lastEventId;
    say(twin, "and again");
    const again = await settle(twin.runAgent());
    // Another conversation: the cursor of this one is not sent along.
    runner.threadId = `${config.threadId}-elsewhere`;
    const switched = await settle(runner.connectAgent());
    emit("done", {
      ...ran,
      ...outcome,
      switched,
      twin: { cursor: twinCursor, after: twin.lastEventId, error: again.error, messages: twin.messages },
      runnerAfter: runner.lastEventId,
    });
  },

  async interrupt() {
    const runner = agent();
    say(runner, config.input);
    await runner.runAgent({ runId: config.runId });
    emit("interrupted", summary(runner));
    // The client refuses, before sending anything, a run that leaves an interrupt unanswered.
    const refused = await settle(runner.runAgent({ resume: [] }));
    emit("uncovered", refused);
    const answers = Object.fromEntries(
      runner.pendingInterrupts.map((i) => [i.id, { status: "resolved", payload: { approved: config.approve ?? true } }]),
    );
    const resume = agui.buildResumeArray(runner.pendingInterrupts, answers);
    const outcome = await settle(runner.runAgent({ resume, runId: config.resumeRunId }));
    emit("resumed", { ...summary(runner), ...outcome, resume });
    if (config.followUp === false) return;
    // A next turn opens with a snapshot holding the tool's output message.
    say(runner, "thank you");
    const next = await settle(runner.runAgent());
    emit("done", { ...summary(runner), ...next });
  },

  async expired() {
    const runner = agent();
    say(runner, config.input);
    await runner.runAgent();
    emit("interrupted", summary(runner));
    await told(); // the interrupt expires meanwhile
    const [interrupt] = runner.pendingInterrupts;
    const expired = agui.isInterruptExpired(interrupt);
    // The client lets an expired interrupt be answered only with "cancelled".
    const approve = { [interrupt.id]: { status: "resolved", payload: { approved: true } } };
    const approved = await settle(runner.runAgent({ resume: agui.buildResumeArray([interrupt], approve) }));
    const resume = agui.buildResumeArray(runner.pendingInterrupts, { [interrupt.id]: { status: "cancelled" } });
    const cancelled = await settle(runner.runAgent({ resume }));
    emit("cancelled", { ...summary(runner), ...cancelled, expired, approved });
    say(runner, config.next ?? "something else");
    const next = await settle(runner.runAgent());
    emit("done", { ...summary(runner), ...next });
  },

  async cancelWhilePaused() {
    // Stopped while it waits for a decision. With `reload`, a fresh agent replays the
    // thread; without, the agent that holds the interrupts answers them "cancelled".
    const runner = agent();
    say(runner, config.input);
    await runner.runAgent();
    emit("interrupted", summary(runner));
    const stopped = await runner.stopRun();
    let chat = runner;
    let cleared;
    if (config.reload) {
      chat = agent();
      cleared = await settle(chat.connectAgent());
    } else {
      say(runner, "never mind");
      const refused = await settle(runner.runAgent());
      const answers = Object.fromEntries(runner.pendingInterrupts.map((i) => [i.id, { status: "cancelled" }]));
      const resume = agui.buildResumeArray(runner.pendingInterrupts, answers);
      cleared = { ...(await settle(runner.runAgent({ resume }))), refused };
    }
    emit("cleared", { ...summary(chat), ...cleared, stopped });
    say(chat, config.next ?? "something else");
    const next = await settle(chat.runAgent());
    emit("done", { ...summary(chat), ...next });
  },

  async decidedElsewhere() {
    const runner = agent();
    say(runner, config.input);
    await runner.runAgent();
    emit("interrupted", summary(runner));
    await told(); // a reviewer decides over HTTP meanwhile
    const outcome = await settle(runner.connectAgent());
    emit("done", { ...summary(runner), ...outcome });
  },

  async drop() {
    // The runner drops its stream mid-story and connects again; a watcher that connected
    // early stays undisturbed; a latecomer connects once the run is over.
    const runner = agent();
    const watcher = agent(config.watchUrl ?? config.url);
    say(runner, config.input);
    let watching;
    let dropped;
    const droppedAt = new Promise((resolve) => (dropped = resolve));
    contentCounter(runner, 3, () => {
      watching = settle(watcher.connectAgent());
    });
    contentCounter(runner, config.dropAfter ?? 20, () => {
      runner.abortRun();
      dropped();
    });
    const first = await settle(runner.runAgent());
    await droppedAt;
    emit("dropped", { lastEventId: runner.lastEventId, messages: runner.messages, first });
    const resumer = config.resumeUrl ? agent(config.resumeUrl, { lastEventId: runner.lastEventId }) : runner;
    if (resumer !== runner) resumer.messages = runner.messages;
    const again = await settle(resumer.connectAgent());
    const watched = await watching;
    const late = agent(config.resumeUrl ?? config.url);
    const latecomer = await settle(late.connectAgent());
    emit("done", {
      resumed: { ...summary(resumer), ...again },
      watcher: { ...summary(watcher), ...watched },
      latecomer: { ...summary(late), ...latecomer },
    });
  },

  async restart() {
    // The gateway is killed mid-story and started again; the runner connects to the new
    // process from its cursor, a latecomer from the start.
    const runner = agent();
    say(runner, config.input);
    contentCounter(runner, config.dropAfter ?? 20, () => emit("midway", { lastEventId: runner.lastEventId }));
    const first = await settle(runner.runAgent());
    emit("cut", { first, lastEventId: runner.lastEventId });
    const { url } = await told();
    runner.url = url;
    const again = await settle(runner.connectAgent());
    const late = agent(url);
    const latecomer = await settle(late.connectAgent());
    emit("done", { resumed: { ...summary(runner), ...again }, latecomer: { ...summary(late), ...latecomer } });
  },

  async stop() {
    // Stopped by the agent that streams the run: its cursor keeps following the stream.
    const runner = agent();
    say(runner, config.input);
    let stopped;
    contentCounter(runner, 5, () => {
      stopped = runner.stopRun();
    });
    const outcome = await settle(runner.runAgent());
    emit("done", { ...summary(runner), ...outcome, stopped: await stopped });
  },

  async connect() {
    const reader = agent(config.url, { lastEventId: config.lastEventId ?? null });
    const outcome = await settle(reader.connectAgent());
    emit("done", { ...summary(reader), ...outcome });
  },
};

try {
  await scenarios[config.scenario]();
} catch (error) {
  emit("failed", { message: String(error?.stack ?? error) });
}
process.exit(0);
