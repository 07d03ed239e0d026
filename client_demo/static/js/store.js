// One thread's view, rebuilt from its event log. Events are applied in seq order and at most
// once (seq <= the last applied seq is ignored), so replays after a reconnect never double
// anything. The state plus its cursor (epoch, seq) is saved to sessionStorage as one value,
// so a page reload restores exactly what was shown and resumes with `after_seq`.

export const STATUS_LABELS = {
  idle: "idle",
  running: "running",
  waiting_for_review: "waiting for review",
  resumed: "resumed",
  completed: "completed",
  failed: "failed",
  suspended: "suspended",
  recovered: "recovered",
  cancelled: "cancelled",
};

const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const SNAPSHOT_VERSION = 2;
// Item versions come from one counter, so a version never repeats within a page, even after
// a reset rebuilt a thread's items under the same keys.
let nextVersion = 1;

/** Counters the tests read through window.__gateway.stats. */
export const stats = {
  applied: 0,
  duplicatesIgnored: 0,
  deltaMismatches: 0,
  resets: 0,
  subscribedFrom: {},
};

export class ThreadState {
  constructor(threadId) {
    this.threadId = threadId;
    this.epoch = null;
    this.headSeq = 0;
    this.version = 0;
    this.clear();
  }

  clear() {
    this.seq = 0;
    this.items = [];
    this.byKey = new Map();
    this.approvalGroup = new Map(); // approval_id -> group item key
    this.runs = {};
    this.lastRunId = null;
    this.title = null;
    this.owner = null;
    this.touch();
  }

  touch() {
    this.version += 1;
  }

  /** `subscribed` frame: remember the epoch; on reset, drop everything shown so far. */
  onSubscribed(frame) {
    if (frame.reset) {
      stats.resets += 1;
      this.clear();
    }
    this.epoch = frame.epoch;
    this.headSeq = Math.max(this.headSeq, frame.head_seq || 0);
    this.touch();
  }

  get lastRun() {
    return this.lastRunId ? this.runs[this.lastRunId] : null;
  }

  get status() {
    return this.lastRun?.status || "idle";
  }

  get activeRunId() {
    const run = this.lastRun;
    return run && !TERMINAL.has(run.status) ? this.lastRunId : null;
  }

  get catchingUp() {
    return this.seq < this.headSeq;
  }

  pendingApprovals() {
    const out = [];
    for (const item of this.items) {
      if (item.kind !== "approvals") continue;
      for (const approval of item.approvals) if (approval.status === "pending") out.push(approval);
    }
    return out;
  }

  // -- applying events ------------------------------------------------------------------------

  /** Apply one `event` frame. Returns true when it changed the state. */
  apply(frame) {
    if (typeof frame.seq !== "number" || frame.seq <= this.seq) {
      stats.duplicatesIgnored += 1;
      return false;
    }
    this.seq = frame.seq;
    this.headSeq = Math.max(this.headSeq, frame.seq);
    stats.applied += 1;
    const data = frame.data || {};
    const runId = frame.run_id;
    const ts = frame.ts;
    const run = runId ? (this.runs[runId] ||= { status: "running", agent: null, startedAt: ts }) : null;

    switch (frame.event) {
      case "run.started": {
        this.lastRunId = runId;
        run.status = "running";
        run.agent = data.agent || null;
        run.input = data.input;
        if (this.title === null && typeof data.input === "string") this.title = data.input;
        // A queued input becomes this run: move it from where it was queued to here.
        const queued = this.items.find(
          (item) => item.kind === "user" && item.state === "queued" && item.text === data.input,
        );
        if (queued) this._remove(queued.key);
        this._add({ kind: "user", key: `u:${frame.seq}`, text: String(data.input ?? ""), state: "sent", runId, ts });
        break;
      }
      case "message.started":
        this._message(data.message_id, runId, ts, data.agent, true);
        break;
      case "message.delta": {
        const item = this._message(data.message_id, runId, ts, null, false);
        item.text += String(data.delta ?? "");
        this._bump(item);
        break;
      }
      case "message.completed": {
        const item = this._message(data.message_id, runId, ts, null, false);
        const text = String(data.text ?? "");
        if (item.fromStart && item.text !== text) {
          stats.deltaMismatches += 1;
          console.warn("message text differs from its deltas", data.message_id);
        }
        item.text = text;
        item.streaming = false;
        if (run) run.lastText = text;
        this._bump(item);
        break;
      }
      case "message.aborted":
        this._remove(`m:${data.message_id}`);
        break;
      case "tool.called": {
        const key = `t:${data.call_id}`;
        const existing = this.byKey.get(key);
        if (existing) {
          Object.assign(existing, { toolName: data.tool_name, args: data.arguments, agent: data.agent });
          this._bump(existing);
        } else {
          this._add({
            kind: "tool",
            key,
            callId: data.call_id,
            toolName: data.tool_name,
            args: data.arguments ?? {},
            agent: data.agent || null,
            output: null,
            hasOutput: false,
            needsApproval: false,
            runId,
            ts,
          });
        }
        break;
      }
      case "tool.output": {
        let item = this.byKey.get(`t:${data.call_id}`);
        if (!item) {
          item = this._add({
            kind: "tool",
            key: `t:${data.call_id}`,
            callId: data.call_id,
            toolName: data.tool_name,
            args: null,
            agent: null,
            needsApproval: false,
            runId,
            ts,
          });
        }
        item.output = String(data.output ?? "");
        item.hasOutput = true;
        this._bump(item);
        break;
      }
      case "agent.changed":
        if (run) run.agent = data.agent;
        this._add({ kind: "notice", key: `n:${frame.seq}`, tone: "info", text: `Handed off to ${data.agent}`, ts });
        break;
      case "approval.requested": {
        const groupKey = `a:${runId}:${data.checkpoint_version}`;
        let group = this.byKey.get(groupKey);
        if (!group) {
          group = this._add({
            kind: "approvals",
            key: groupKey,
            runId,
            checkpointVersion: data.checkpoint_version,
            approvals: [],
            ts,
          });
        }
        if (!group.approvals.some((a) => a.approvalId === data.approval_id)) {
          group.approvals.push({
            approvalId: data.approval_id,
            callId: data.call_id,
            toolName: data.tool_name,
            args: data.arguments ?? {},
            agent: data.agent || null,
            requestedAt: data.requested_at || ts,
            status: "pending",
            decision: null,
            reason: null,
            reviewer: null,
            decidedAt: null,
          });
        }
        this.approvalGroup.set(data.approval_id, groupKey);
        const tool = this.byKey.get(`t:${data.call_id}`);
        if (tool) {
          tool.needsApproval = true;
          this._bump(tool);
        }
        this._bump(group);
        break;
      }
      case "approval.decided": {
        const group = this.byKey.get(this.approvalGroup.get(data.approval_id));
        const approval = group?.approvals.find((a) => a.approvalId === data.approval_id);
        if (approval) {
          approval.status = data.decision === "approve" ? "approved" : "rejected";
          approval.decision = data.decision;
          approval.reason = data.reason ?? null;
          approval.reviewer = data.reviewer ?? null;
          approval.decidedAt = data.decided_at || ts;
          this._bump(group);
          const tool = this.byKey.get(`t:${approval.callId}`);
          if (tool) {
            tool.decision = data.decision;
            this._bump(tool);
          }
        }
        break;
      }
      case "run.paused":
        if (run) run.status = data.reason === "approval" ? "waiting_for_review" : "suspended";
        if (data.reason && data.reason !== "approval") {
          this._add({
            kind: "notice",
            key: `n:${frame.seq}`,
            tone: "warn",
            text: `Run suspended (${data.reason}); it continues when resumed.`,
            ts,
          });
        }
        break;
      case "run.resumed":
        if (run) run.status = "resumed";
        for (const item of this.items) {
          if (item.kind === "user" && item.state === "staged" && item.runId === runId) {
            item.state = "delivered";
            this._bump(item);
          }
        }
        break;
      case "run.recovered":
        if (run) run.status = "recovered";
        this._add({
          kind: "notice",
          key: `n:${frame.seq}`,
          tone: "warn",
          text: "The gateway restarted; this run was recovered and continues.",
          ts,
        });
        break;
      case "input.staged":
        this._add({ kind: "user", key: `u:${frame.seq}`, text: String(data.input ?? ""), state: "staged", runId, ts });
        break;
      case "input.queued":
        this._add({ kind: "user", key: `u:${frame.seq}`, text: String(data.input ?? ""), state: "queued", runId, ts });
        break;
      case "run.completed": {
        if (run) run.status = "completed";
        const output = typeof data.final_output === "string" ? data.final_output : "";
        // Structured outputs and the like: show the final output when no message carried it.
        if (output && run && run.lastText !== output) {
          this._add({ kind: "assistant", key: `f:${runId}`, messageId: null, text: output, agent: run.agent, streaming: false, fromStart: false, runId, ts });
        }
        this._endRun(runId, "completed");
        break;
      }
      case "run.failed": {
        if (run) run.status = "failed";
        const error = data.error || {};
        this._add({
          kind: "notice",
          key: `n:${frame.seq}`,
          tone: "error",
          text: `Run failed${error.code ? ` (${error.code})` : ""}: ${error.message || "unknown error"}`,
          ts,
        });
        this._endRun(runId, "failed");
        break;
      }
      case "run.cancelled":
        if (run) run.status = "cancelled";
        this._add({ kind: "notice", key: `n:${frame.seq}`, tone: "muted", text: "Run cancelled.", ts });
        this._endRun(runId, "cancelled");
        break;
      default:
        // Newer gateways may add event types: ignore what we do not know.
        break;
    }
    this.touch();
    return true;
  }

  _message(messageId, runId, ts, agent, started) {
    const key = `m:${messageId}`;
    let item = this.byKey.get(key);
    if (!item) {
      item = this._add({
        kind: "assistant",
        key,
        messageId,
        text: "",
        agent: agent || this.runs[runId]?.agent || null,
        streaming: true,
        // Only a message seen from its start can be checked against its completed text.
        fromStart: started,
        runId,
        ts,
      });
    }
    return item;
  }

  _endRun(runId, outcome) {
    for (const item of this.items) {
      if (item.kind === "assistant" && item.runId === runId && item.streaming) {
        item.streaming = false;
        this._bump(item);
      }
      if (item.kind !== "approvals" || item.runId !== runId) continue;
      let changed = false;
      for (const approval of item.approvals) {
        if (approval.status === "pending") {
          approval.status = "superseded";
          approval.outcome = outcome;
          changed = true;
        }
      }
      if (changed) this._bump(item);
    }
  }

  _add(item) {
    item.v = nextVersion++;
    this.items.push(item);
    this.byKey.set(item.key, item);
    return item;
  }

  _bump(item) {
    item.v = nextVersion++;
  }

  _remove(key) {
    const item = this.byKey.get(key);
    if (!item) return;
    this.byKey.delete(key);
    this.items.splice(this.items.indexOf(item), 1);
  }

  // -- snapshots ----------------------------------------------------------------------------

  toSnapshot() {
    return {
      v: SNAPSHOT_VERSION,
      threadId: this.threadId,
      epoch: this.epoch,
      seq: this.seq,
      headSeq: this.headSeq,
      items: this.items,
      runs: this.runs,
      lastRunId: this.lastRunId,
      title: this.title,
    };
  }

  static fromSnapshot(threadId, snap) {
    const state = new ThreadState(threadId);
    if (!snap || snap.v !== SNAPSHOT_VERSION || snap.threadId !== threadId || !snap.epoch) return state;
    state.epoch = snap.epoch;
    state.seq = snap.seq || 0;
    state.headSeq = snap.headSeq || state.seq;
    state.items = Array.isArray(snap.items) ? snap.items : [];
    state.runs = snap.runs || {};
    state.lastRunId = snap.lastRunId || null;
    state.title = snap.title ?? null;
    for (const item of state.items) {
      item.v = nextVersion++;
      state.byKey.set(item.key, item);
      if (item.kind === "approvals") {
        for (const approval of item.approvals) state.approvalGroup.set(approval.approvalId, item.key);
      }
    }
    state.touch();
    return state;
  }
}

/**
 * sessionStorage holds one value per thread: the snapshot and its cursor together, so they
 * can never disagree. Writes are debounced and flushed on pagehide.
 */
export class SnapshotStore {
  constructor(scope) {
    this.prefix = `gw.thread.${scope}.`;
    this.dirty = new Map();
    this.timer = null;
    this.protect = new Set();
  }

  load(threadId) {
    try {
      const raw = sessionStorage.getItem(this.prefix + threadId);
      return raw ? JSON.parse(raw) : null;
    } catch {
      return null;
    }
  }

  /** The cursor for a thread: {epoch, seq} or null. */
  cursor(threadId) {
    const snap = this.load(threadId);
    return snap ? { epoch: snap.epoch, seq: snap.seq } : null;
  }

  save(state) {
    this.dirty.set(state.threadId, state);
    if (!this.timer) this.timer = setTimeout(() => this.flush(), 250);
  }

  flush() {
    clearTimeout(this.timer);
    this.timer = null;
    for (const state of this.dirty.values()) this._write(state);
    this.dirty.clear();
  }

  forget(threadId) {
    this.dirty.delete(threadId);
    try {
      sessionStorage.removeItem(this.prefix + threadId);
    } catch {
      /* ignore */
    }
  }

  _write(state) {
    if (!state.epoch) return;
    const key = this.prefix + state.threadId;
    const value = JSON.stringify(state.toSnapshot());
    try {
      sessionStorage.setItem(key, value);
      return;
    } catch {
      /* quota: make room below */
    }
    this._evictExcept(state.threadId);
    try {
      sessionStorage.setItem(key, value);
    } catch {
      // Still too big: keep no snapshot rather than a stale one; a reload replays from 0.
      this.forget(state.threadId);
    }
  }

  _evictExcept(threadId) {
    try {
      const keys = [];
      for (let i = 0; i < sessionStorage.length; i += 1) {
        const key = sessionStorage.key(i);
        if (key?.startsWith(this.prefix) && key !== this.prefix + threadId) keys.push(key);
      }
      for (const key of keys) {
        if (!this.protect.has(key.slice(this.prefix.length))) sessionStorage.removeItem(key);
      }
    } catch {
      /* ignore */
    }
  }
}
