// One thread's events folded into a plain, JSON-serialisable state. `applyEvent` is pure and
// returns a new object whenever something changed (the same object when nothing did), so
// React and other change detectors can compare by identity, and a state can be stored with
// its cursor and restored after a reload. Event shapes: docs/protocol.md §6.

/** @typedef {import("../types/protocol.js").EventFrame} EventFrame */

/**
 * @typedef {"idle" | "running" | "waiting_for_review" | "suspended" | "completed" | "failed" | "cancelled"} RunStatus
 *
 * @typedef {object} InputItem       what a user sent
 * @property {"input"} kind
 * @property {string} id
 * @property {number} seq
 * @property {string | null} runId
 * @property {string} text
 * @property {"started" | "staged" | "queued" | "delivered" | "dropped"} status  staged/queued:
 *   waiting to be taken up; delivered: a staged input the continued run took in; dropped: a
 *   staged input its run never took in, as it ended (cancelled, failed) without continuing
 *
 * @typedef {object} MessageItem     an agent's message, its text growing as deltas arrive
 * @property {"message"} kind
 * @property {string} id             message_id
 * @property {number} seq
 * @property {string | null} runId
 * @property {string} agent
 * @property {string} text
 * @property {"streaming" | "completed" | "aborted" | "stopped"} status  stopped: cut by a
 *   cancel, its text kept
 * @property {string} [abortReason]
 * @property {boolean} fromStart      seen from its `message.started` (else its deltas are partial)
 *
 * @typedef {object} ToolItem        a tool call and, once it ran, its output
 * @property {"tool"} kind
 * @property {string} id             call_id
 * @property {number} seq
 * @property {string | null} runId
 * @property {string} toolName
 * @property {Record<string, unknown>} arguments
 * @property {string} agent
 * @property {string | null} output
 * @property {"called" | "done" | "needs_reconciliation"} status
 *
 * @typedef {object} ApprovalItem    a call waiting for (or given) a human decision
 * @property {"approval"} kind
 * @property {string} id             approval_id
 * @property {number} seq
 * @property {string | null} runId
 * @property {string} callId
 * @property {string} toolName
 * @property {Record<string, unknown>} arguments
 * @property {string} agent
 * @property {"pending" | "approved" | "rejected" | "superseded" | "expired"} status
 * @property {string | null} reviewer
 * @property {string | null} reason
 * @property {string | null} expiresAt
 * @property {string | null} requestedAt
 * @property {string | null} decidedAt
 * @property {number | null} checkpointVersion  the approvals of one pause share it
 * @property {string | null} outcome  superseded: how the run ended first ("completed", "cancelled"...)
 * @property {"user" | "reviewer" | "either" | null} decidedBy  who decides it (§3 "Who decides")
 * @property {string[]} reviewerRoles  roles of which a decider must hold one; empty: any
 * @property {string | null} [rule]  the graph's approval rule that decided it by itself
 * @property {boolean} [argumentsEditable]  a reviewer may approve it with edited arguments (§4)
 * @property {Record<string, unknown> | null} [editedArguments]  the arguments it was approved with, when edited
 *
 * @typedef {object} ReasoningItem   a model's reasoning summary, its text growing as deltas arrive
 * @property {"reasoning"} kind
 * @property {string} id             reasoning_id
 * @property {number} seq
 * @property {string | null} runId
 * @property {string} agent
 * @property {string} text
 * @property {"streaming" | "completed" | "aborted"} status  aborted: the run stopped first
 *
 * @typedef {object} TokenUsage      tokens, as the provider reported them (docs/protocol.md §6)
 * @property {number} requests
 * @property {number} input_tokens
 * @property {number} output_tokens
 * @property {number} total_tokens
 * @property {number} cached_tokens
 * @property {number} reasoning_tokens
 *
 * @typedef {object} NoticeItem      something about the run itself worth showing in the timeline
 * @property {"notice"} kind
 * @property {string} id
 * @property {number} seq
 * @property {string | null} runId
 * @property {"agent.changed" | "run.suspended" | "run.recovered" | "run.failed" | "run.cancelled"} event
 * @property {string | null} [agent]   agent.changed: the new agent
 * @property {string | null} [reason]  run.suspended: `disconnect` or `shutdown`
 * @property {{code: string, message: string} | null} [error]  run.failed
 *
 * @typedef {InputItem | MessageItem | ReasoningItem | ToolItem | ApprovalItem | NoticeItem} Item
 *
 * @typedef {object} RunInfo
 * @property {string} runId
 * @property {RunStatus} status
 * @property {string | null} agent
 * @property {string | null} input
 * @property {string | null} finalOutput
 * @property {{code: string, message: string} | null} error
 * @property {string | null} pausedReason
 * @property {string | null} lastText  the run's last completed message
 * @property {TokenUsage | null} usage  the run's tokens so far (its totals once it ended)
 * @property {string | null} supersedes    the run whose answer this one replaced (regenerate)
 * @property {string | null} supersededBy  the run that replaced this one's answer
 * @property {string | null} retries    the failed run this one goes on from (retry)
 * @property {string | null} retriedBy  the run that retried this failed one
 *
 * @typedef {object} ThreadState
 * @property {string} threadId
 * @property {string | null} epoch
 * @property {number} seq          the last applied seq: the cursor
 * @property {number} headSeq      the thread's newest seq when last subscribed
 * @property {Item[]} items        in log order
 * @property {Record<string, RunInfo>} runs
 * @property {string | null} runId the newest run
 * @property {RunStatus} status    the newest run's status ("idle" before any)
 * @property {string | null} activeRunId the newest run unless it ended
 * @property {string | null} title  the thread's first input
 * @property {number} mismatches   messages whose deltas did not add up to their final text
 */

const TERMINAL = new Set(["completed", "failed", "cancelled"]);

/** @param {string} threadId @returns {ThreadState} */
export function emptyThread(threadId) {
  return {
    threadId,
    epoch: null,
    seq: 0,
    headSeq: 0,
    items: [],
    runs: {},
    runId: null,
    status: "idle",
    activeRunId: null,
    title: null,
    mismatches: 0,
  };
}

/** @param {RunStatus} status */
export function isTerminal(status) {
  return TERMINAL.has(status);
}

/**
 * The state after a `subscribed` frame: a reset (the cursor could not be honoured, §4
 * `thread.subscribe`) throws away everything shown, since the replay that follows starts over.
 * @param {ThreadState} state
 * @param {{epoch: string, head_seq: number, reset: boolean}} frame
 * @returns {ThreadState}
 */
export function applySubscribed(state, frame) {
  const base = frame.reset ? emptyThread(state.threadId) : state;
  return { ...base, epoch: frame.epoch, headSeq: Math.max(frame.reset ? 0 : state.headSeq, frame.head_seq || 0) };
}

/**
 * Fold one event. Events at or below the cursor were applied already and leave the state as
 * it is: that is what makes replays after a reconnect safe.
 * @param {ThreadState} state
 * @param {EventFrame} frame
 * @returns {ThreadState}
 */
export function applyEvent(state, frame) {
  if (typeof frame.seq !== "number" || frame.seq <= state.seq) return state;
  const next = fold({ ...state, seq: frame.seq, headSeq: Math.max(state.headSeq, frame.seq) }, frame);
  const run = next.runId ? next.runs[next.runId] : null;
  next.status = run ? run.status : "idle";
  next.activeRunId = run && !TERMINAL.has(run.status) ? run.runId : null;
  return next;
}

/** @param {ThreadState} s @param {EventFrame} frame @returns {ThreadState} */
function fold(s, frame) {
  const data = /** @type {Record<string, any>} */ (frame.data || {});
  const runId = frame.run_id ?? null;
  const seq = frame.seq;
  switch (frame.event) {
    case "run.started": {
      s = setRun(s, runId, {
        status: "running", agent: data.agent ?? null, input: data.input ?? null,
        supersedes: data.supersedes ?? null, retries: data.retries ?? null,
      });
      // A regenerated or edited answer: the earlier run stays, marked as replaced (§4).
      if (data.supersedes) s = setRun(s, data.supersedes, { supersededBy: runId });
      // A retry goes on from the failed run: both stay, the failed one marked as retried.
      if (data.retries) s = setRun(s, data.retries, { retriedBy: runId });
      s.runId = runId;
      if (s.title === null && typeof data.input === "string") s.title = data.input;
      // A retry answers the failed run's input, already shown: the conversation goes on.
      if (data.retries) return s;
      // A queued input becomes this run's input: show it once, where its run starts.
      const queued = s.items.findIndex((i) => i.kind === "input" && i.status === "queued" && i.text === data.input);
      if (queued >= 0) s = { ...s, items: s.items.filter((_, index) => index !== queued) };
      return push(s, { kind: "input", id: `input-${seq}`, seq, runId, text: data.input ?? "", status: "started" });
    }
    case "input.staged":
    case "input.queued":
      return push(s, {
        kind: "input",
        id: `input-${seq}`,
        seq,
        runId: frame.event === "input.staged" ? runId : null,
        text: data.input ?? "",
        status: frame.event === "input.staged" ? "staged" : "queued",
      });
    case "message.started":
      return upsert(s, "message", data.message_id, {
        kind: "message", id: data.message_id, seq, runId, agent: data.agent ?? runAgent(s, runId), text: "",
        status: "streaming", fromStart: true,
      });
    case "message.delta": {
      const index = find(s, "message", data.message_id);
      if (index < 0) {
        return push(s, {
          kind: "message", id: data.message_id, seq, runId, agent: runAgent(s, runId), text: data.delta ?? "",
          status: "streaming", fromStart: false,
        });
      }
      return update(s, index, { text: s.items[index].text + (data.delta ?? "") });
    }
    case "message.completed": {
      const index = find(s, "message", data.message_id);
      const text = data.text ?? "";
      s = setRun(s, runId, { lastText: text });
      if (index < 0) {
        return push(s, {
          kind: "message", id: data.message_id, seq, runId, agent: runAgent(s, runId), text, status: "completed",
          fromStart: false,
        });
      }
      // The completed text is authoritative; a streamed text that differs is counted so a
      // test (or a curious operator) can see that deltas were lost or doubled.
      if (s.items[index].fromStart && s.items[index].text !== text) s.mismatches += 1;
      return update(s, index, { text, status: "completed" });
    }
    case "message.aborted": {
      const index = find(s, "message", data.message_id);
      if (index < 0) return s;
      // §6: a message that will never complete; its partial text is dropped, unless it was
      // stopped (reason cancelled, with the text the gateway keeps).
      if (data.reason === "cancelled" && typeof data.text === "string") {
        return update(s, index, { text: data.text, status: "stopped", abortReason: "cancelled" });
      }
      return update(s, index, { text: "", status: "aborted", abortReason: data.reason ?? null });
    }
    case "tool.called":
      return upsert(s, "tool", data.call_id, {
        kind: "tool", id: data.call_id, seq, runId, toolName: data.tool_name, arguments: data.arguments ?? {},
        agent: data.agent ?? "", output: null, status: "called",
      });
    case "tool.output": {
      const index = find(s, "tool", data.call_id);
      if (index < 0) {
        return push(s, {
          kind: "tool", id: data.call_id, seq, runId, toolName: data.tool_name, arguments: {}, agent: "",
          output: data.output ?? "", status: "done",
        });
      }
      return update(s, index, { output: data.output ?? "", status: s.items[index].status === "needs_reconciliation" ? "needs_reconciliation" : "done" });
    }
    case "tool.needs_reconciliation": {
      const index = find(s, "tool", data.call_id);
      return index < 0 ? s : update(s, index, { status: "needs_reconciliation" });
    }
    case "approval.requested": {
      // A call asking again under a fresh approval supersedes its older, undecided one.
      s = mapItems(s, (i) => (i.kind === "approval" && i.callId === data.call_id && i.status === "pending" ? { ...i, status: "superseded" } : i));
      return upsert(s, "approval", data.approval_id, {
        kind: "approval", id: data.approval_id, seq, runId, callId: data.call_id, toolName: data.tool_name,
        arguments: data.arguments ?? {}, agent: data.agent ?? "", status: "pending", reviewer: null, reason: null,
        expiresAt: data.expires_at ?? null, requestedAt: data.requested_at ?? frame.ts ?? null, decidedAt: null,
        checkpointVersion: data.checkpoint_version ?? null, outcome: null,
        decidedBy: data.decided_by ?? null, reviewerRoles: data.reviewer_roles ?? [],
        argumentsEditable: data.arguments_editable === true, editedArguments: null,
      });
    }
    case "approval.decided": {
      const index = find(s, "approval", data.approval_id);
      // A call the graph's rule decided by itself was never requested (§4 "Rules that decide").
      if (index < 0 && data.rule) return push(s, ruleDecision(frame, data));
      if (index < 0) return s;
      const status = data.expired ? "expired" : data.decision === "approve" ? "approved" : "rejected";
      return update(s, index, {
        status, reviewer: data.reviewer ?? null, reason: data.reason ?? null, decidedAt: data.decided_at ?? frame.ts ?? null,
        rule: data.rule ?? null, editedArguments: data.edited_arguments ?? null,
      });
    }
    case "reasoning.started":
      return upsert(s, "reasoning", data.reasoning_id, {
        kind: "reasoning", id: data.reasoning_id, seq, runId, agent: data.agent ?? runAgent(s, runId), text: "", status: "streaming",
      });
    case "reasoning.delta": {
      const index = find(s, "reasoning", data.reasoning_id);
      if (index < 0) return s;
      return update(s, index, { text: s.items[index].text + (data.delta ?? "") });
    }
    case "reasoning.completed": {
      const index = find(s, "reasoning", data.reasoning_id);
      const fields = { text: data.text ?? "", status: data.aborted ? "aborted" : "completed" };
      return index < 0
        ? push(s, { kind: "reasoning", id: data.reasoning_id, seq, runId, agent: runAgent(s, runId), ...fields })
        : update(s, index, fields);
    }
    case "model.usage":
      return setRun(s, runId, { usage: addUsage(runId ? s.runs[runId]?.usage ?? null : null, data) });
    case "run.paused": {
      const approval = data.reason === "approval";
      s = setRun(s, runId, { status: approval ? "waiting_for_review" : "suspended", pausedReason: data.reason ?? null });
      return approval ? s : notice(s, frame, "run.suspended", { reason: data.reason ?? null });
    }
    case "run.resumed":
      return setRun(deliverStaged(s, runId), runId, { status: "running", pausedReason: null });
    case "run.recovered":
      // A run taken over between its claim to continue and its `run.resumed` applies the
      // staged input in this continuation instead.
      s = deliverStaged(s, runId);
      return notice(setRun(s, runId, { status: "running", pausedReason: null }), frame, "run.recovered", {});
    case "agent.changed":
      return notice(setRun(s, runId, { agent: data.agent ?? null }), frame, "agent.changed", { agent: data.agent ?? null });
    case "run.completed":
      s = setRun(s, runId, { status: "completed", finalOutput: data.final_output ?? "", ...totals(data) });
      return endRun(s, runId, "completed");
    case "run.failed":
      s = notice(setRun(s, runId, { status: "failed", error: data.error ?? null, ...totals(data) }), frame, "run.failed", { error: data.error ?? null });
      return endRun(s, runId, "failed");
    case "run.cancelled":
      return endRun(notice(setRun(s, runId, { status: "cancelled", ...totals(data) }), frame, "run.cancelled", {}), runId, "cancelled");
    default:
      return s; // an event type added after this client was written: §6 allows additions
  }
}

/** The approval item of a call a rule decided: decided from the start, by no one. */
function ruleDecision(frame, data) {
  const status = data.decision === "approve" ? "approved" : "rejected";
  return {
    kind: "approval", id: data.approval_id, seq: frame.seq, runId: frame.run_id ?? null, callId: data.call_id ?? "",
    toolName: data.tool_name ?? "", arguments: {}, agent: "", status, reviewer: null, reason: data.reason ?? null,
    expiresAt: null, requestedAt: data.decided_at ?? frame.ts ?? null, decidedAt: data.decided_at ?? frame.ts ?? null,
    checkpointVersion: null, outcome: null, decidedBy: null, reviewerRoles: [], rule: data.rule,
  };
}

function find(s, kind, id) {
  return s.items.findIndex((i) => i.kind === kind && i.id === id);
}

function push(s, item) {
  return { ...s, items: [...s.items, item] };
}

function update(s, index, fields) {
  const items = s.items.slice();
  items[index] = { ...items[index], ...fields };
  return { ...s, items };
}

function upsert(s, kind, id, item) {
  const index = find(s, kind, id);
  return index < 0 ? push(s, item) : update(s, index, item);
}

function mapItems(s, fn) {
  return { ...s, items: s.items.map(fn) };
}

function notice(s, frame, event, fields) {
  return push(s, { kind: "notice", id: `notice-${frame.seq}`, seq: frame.seq, runId: frame.run_id ?? null, event, ...fields });
}

function runAgent(s, runId) {
  return (runId && s.runs[runId]?.agent) || "";
}

function setRun(s, runId, fields) {
  if (!runId) return s;
  const run = s.runs[runId] ?? {
    runId, status: "running", agent: null, input: null, finalOutput: null, error: null, pausedReason: null, lastText: null, usage: null,
    supersedes: null, supersededBy: null, retries: null, retriedBy: null,
  };
  const runs = { ...s.runs, [runId]: { ...run, ...fields } };
  return { ...s, runs, runId: s.runId ?? runId };
}

const USAGE_FIELDS = ["input_tokens", "output_tokens", "total_tokens", "cached_tokens", "reasoning_tokens"];

/** One model call's `model.usage` added to a run's tokens so far. */
function addUsage(usage, call) {
  const sum = { requests: (usage?.requests ?? 0) + 1 };
  for (const name of USAGE_FIELDS) sum[name] = (usage?.[name] ?? 0) + (call[name] ?? 0);
  return sum;
}

/** A finished run's totals (the SDK's count over all its model calls), when it reported any. */
function totals(data) {
  return data.usage ? { usage: data.usage } : {};
}

/** Staged input goes into the run's state as it continues, before its next model call. */
function deliverStaged(s, runId) {
  return mapItems(s, (i) => (i.kind === "input" && i.status === "staged" && i.runId === runId ? { ...i, status: "delivered" } : i));
}

/**
 * A run that ended leaves no approval pending (cancelling supersedes them, §6), no message
 * streaming, and no input staged: the gateway applies staged input only when the paused run
 * continues (`run.resumed`), and neither the next queued run nor a retry takes it up, so input
 * still staged when its run ends is never read.
 */
function endRun(s, runId, outcome) {
  return mapItems(s, (i) => {
    if (i.runId !== runId) return i;
    if (i.kind === "approval" && i.status === "pending") return { ...i, status: "superseded", outcome };
    if (i.kind === "input" && i.status === "staged") return { ...i, status: "dropped" };
    if ((i.kind === "message" || i.kind === "reasoning") && i.status === "streaming") return { ...i, status: "completed" };
    return i;
  });
}

/** @param {ThreadState} state @returns {MessageItem[]} */
export function messages(state) {
  return /** @type {MessageItem[]} */ (state.items.filter((i) => i.kind === "message"));
}

/** @param {ThreadState} state @returns {ApprovalItem[]} */
export function pendingApprovals(state) {
  return /** @type {ApprovalItem[]} */ (state.items.filter((i) => i.kind === "approval" && i.status === "pending"));
}
