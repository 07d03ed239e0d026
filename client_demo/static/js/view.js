// Renders a thread's state (folded by the client package, gateway-client/thread.js) into the
// chat log. The package's state is immutable: an item that did not change is the same object,
// so `viewItems` turns it into the view's entries once and gives each entry a version; a node
// is rebuilt or patched only when its entry's version changed, so streaming a long answer
// touches one text node per frame and typing in an approval card's reason box is never
// disturbed by other updates.

import { argsSummary, clear, h, icon, prettyJson, setText, setTime, timeEl } from "./dom.js";

export const STATUS_LABELS = {
  idle: "idle",
  running: "running",
  waiting_for_review: "waiting for review",
  completed: "completed",
  failed: "failed",
  suspended: "suspended",
  cancelled: "cancelled",
};

const USER_STATE_LABELS = {
  staged: "Waiting — read once the approval is decided",
  delivered: "Read by the assistant",
  dropped: "Not read — the answer ended before it continued",
  queued: "Waiting — answered once the current answer is finished",
};

const TOOL_STATE_LABELS = {
  running: "calling…",
  approval: "needs approval",
  done: "done",
  rejected: "rejected",
};

export class ChatView {
  /**
   * @param {HTMLElement} list  the <ol> that holds the conversation
   * @param {object} actions   {decide(approvalId, decision, reason), canDecide(approval), me()}
   */
  constructor(list, actions) {
    this.list = list;
    this.actions = actions;
    this.nodes = new Map(); // key -> {el, v, patch}
    this.threadId = undefined;
    this.cardState = new Map(); // approval_id -> {busy, error}
  }

  reset(threadId) {
    this.threadId = threadId;
    this.nodes.clear();
    clear(this.list);
  }

  render(state) {
    if (!state) {
      if (this.threadId !== null) this.reset(null);
      return;
    }
    if (state.threadId !== this.threadId) this.reset(state.threadId);
    const items = viewItems(state);
    const wanted = new Set(items.map((item) => item.key));
    for (const [key, node] of this.nodes) {
      if (!wanted.has(key)) {
        node.el.remove();
        this.nodes.delete(key);
      }
    }
    let previous = null;
    for (const item of items) {
      let node = this.nodes.get(item.key);
      if (!node || node.kind !== item.kind) {
        node?.el.remove();
        node = this._create(item);
        this.nodes.set(item.key, node);
      }
      if (node.v !== item.v || node.dirty) {
        node.patch(item);
        node.v = item.v;
        node.dirty = false;
      }
      const expectedNext = previous ? previous.nextSibling : this.list.firstChild;
      if (expectedNext !== node.el) this.list.insertBefore(node.el, expectedNext);
      previous = node.el;
    }
  }

  /** Re-patch every approval card (roles or a card's local state changed). */
  invalidateApprovals() {
    for (const node of this.nodes.values()) if (node.kind === "approvals") node.dirty = true;
  }

  _create(item) {
    switch (item.kind) {
      case "user":
        return this._userNode(item);
      case "assistant":
        return this._assistantNode(item);
      case "tool":
        return this._toolNode(item);
      case "reasoning":
        return this._reasoningNode(item);
      case "approvals":
        return this._approvalsNode(item);
      default:
        return this._noticeNode(item);
    }
  }

  _userNode(item) {
    const text = h("div", { class: "bubble-text", dataset: { testid: "message-text" } });
    const tag = h("div", { class: "input-state", dataset: { testid: "input-state" } });
    const el = h(
      "li",
      { class: "msg msg-user", dataset: { testid: "message", role: "user", key: item.key } },
      h("div", { class: "bubble" }, text),
      tag,
    );
    return {
      kind: "user",
      el,
      v: 0,
      patch: (it) => {
        setText(text, it.text);
        el.dataset.state = it.state;
        const label = USER_STATE_LABELS[it.state] || "";
        setText(tag, label);
        tag.hidden = !label;
      },
    };
  }

  _assistantNode(item) {
    const text = h("div", { class: "bubble-text", dataset: { testid: "message-text" } });
    const agent = h("span", { class: "msg-agent" });
    const stopped = h("span", { class: "msg-stopped", dataset: { testid: "message-stopped" } }, "Stopped");
    const replaced = h("span", { class: "msg-stopped", dataset: { testid: "message-replaced" } }, "Earlier version");
    const el = h(
      "li",
      { class: "msg msg-assistant", dataset: { testid: "message", role: "assistant", key: item.key } },
      h("div", { class: "avatar", "aria-hidden": "true" }, "AI"),
      h("div", { class: "msg-body" }, h("div", { class: "msg-meta" }, agent, stopped, replaced), h("div", { class: "bubble" }, text)),
    );
    if (item.messageId) el.dataset.messageId = item.messageId;
    return {
      kind: "assistant",
      el,
      v: 0,
      patch: (it) => {
        setText(text, it.text);
        setText(agent, it.agent || "assistant");
        el.classList.toggle("streaming", Boolean(it.streaming));
        el.dataset.streaming = it.streaming ? "true" : "false";
        stopped.hidden = !it.stopped;
        replaced.hidden = !it.replaced;
        el.classList.toggle("replaced", Boolean(it.replaced));
      },
    };
  }

  _reasoningNode(item) {
    // The model's reasoning summary, folded away under its label unless the reader opens it.
    const text = h("div", { class: "reasoning-text", dataset: { testid: "reasoning-text" } });
    const label = h("summary", { class: "reasoning-label" });
    const el = h(
      "li",
      { class: "msg msg-reasoning", dataset: { testid: "reasoning", key: item.key } },
      h("details", { class: "reasoning" }, label, text),
    );
    return {
      kind: "reasoning",
      el,
      v: 0,
      patch: (it) => {
        setText(text, it.text);
        setText(label, it.streaming ? "Thinking…" : "Thought it over");
      },
    };
  }

  _toolNode(item) {
    const name = h("span", { class: "tool-name", dataset: { testid: "tool-name" } });
    const args = h("code", { class: "tool-args", dataset: { testid: "tool-args" } });
    const flag = h("span", { class: "tool-flag" });
    const chip = h(
      "div",
      { class: "tool-chip", dataset: { testid: "tool-call" } },
      h("span", { class: "tool-icon" }, icon("tool")),
      name,
      args,
      flag,
    );
    const outputText = h("pre", { class: "tool-output-text", dataset: { testid: "tool-output-text" } });
    const outputSummary = h("summary", {}, "Output");
    const output = h("details", { class: "tool-output", dataset: { testid: "tool-output" } }, outputSummary, outputText);
    const el = h("li", { class: "tool", dataset: { key: item.key, callId: item.callId } }, chip, output);
    return {
      kind: "tool",
      el,
      v: 0,
      patch: (it) => {
        setText(name, it.toolName || "tool");
        setText(args, it.args ? argsSummary(it.args) : "");
        args.title = it.args ? prettyJson(it.args) : "";
        args.hidden = !it.args;
        output.hidden = !it.hasOutput;
        setText(outputText, it.output ?? "");
        setText(outputSummary, it.hasOutput ? `Output · ${argsSummary(it.output, 60)}` : "Output");
        let state = "running";
        if (it.decision === "reject") state = "rejected";
        else if (it.hasOutput) state = "done";
        else if (it.needsApproval) state = "approval";
        chip.dataset.state = state;
        setText(flag, TOOL_STATE_LABELS[state]);
      },
    };
  }

  _noticeNode(item) {
    const el = h("li", { class: `notice tone-${item.tone || "info"}`, dataset: { testid: "notice", key: item.key } });
    return { kind: item.kind, el, v: 0, patch: (it) => setText(el, it.text) };
  }

  _approvalsNode(item) {
    const title = h("div", { class: "approvals-title" });
    const cards = h("div", { class: "approval-cards" });
    const el = h(
      "li",
      { class: "approvals", dataset: { testid: "approval-group", key: item.key } },
      title,
      cards,
    );
    const cardNodes = new Map();
    return {
      kind: "approvals",
      el,
      v: 0,
      patch: (it) => {
        const pending = it.approvals.filter((a) => a.status === "pending").length;
        const n = it.approvals.length;
        setText(
          title,
          pending
            ? `${pending === 1 ? "An action needs" : `${pending} actions need`} approval`
            : n === 1
              ? "Approval"
              : `Approvals (${n})`,
        );
        el.dataset.pending = String(pending);
        for (const approval of it.approvals) {
          let card = cardNodes.get(approval.approvalId);
          if (!card) {
            card = this._approvalCard(approval);
            cardNodes.set(approval.approvalId, card);
            cards.append(card.el);
          }
          card.patch(approval);
        }
      },
    };
  }

  _approvalCard(approval) {
    const id = approval.approvalId;
    const reasonId = `reason-${id}`;
    const tool = h("span", { class: "approval-tool", dataset: { testid: "approval-tool" } });
    const agent = h("span", { class: "approval-agent", dataset: { testid: "approval-agent" } });
    const time = timeEl(approval.requestedAt);
    time.dataset.testid = "approval-time";
    const args = h("pre", { class: "approval-args", dataset: { testid: "approval-args" } });
    // Tools whose graph allows it (docs/protocol.md §4 "Approve with edits"): the reviewer may
    // change the call's arguments, as JSON, before approving.
    const argsEditor = h("textarea", {
      class: "approval-args-editor",
      rows: "4",
      spellcheck: "false",
      "aria-label": "Arguments to approve with",
      dataset: { testid: "approval-args-editor" },
    });
    argsEditor.hidden = true;
    const editArgs = h("button", { type: "button", class: "btn btn-small btn-ghost", dataset: { testid: "edit-arguments" } }, "Change");
    const reason = h("textarea", {
      id: reasonId,
      class: "approval-reason",
      rows: "2",
      maxlength: "4000",
      placeholder: "Reason (optional; if you reject, the model is told this)",
      dataset: { testid: "approval-reason" },
    });
    const approve = h("button", { type: "button", class: "btn btn-approve", dataset: { testid: "approve-button" } }, "Approve");
    const reject = h("button", { type: "button", class: "btn btn-reject", dataset: { testid: "reject-button" } }, "Reject");
    const error = h("p", { class: "approval-error", role: "alert", dataset: { testid: "approval-error" } });
    const actions = h(
      "div",
      { class: "approval-actions", dataset: { testid: "approval-actions" } },
      h("label", { class: "sr-only", for: reasonId }, "Reason"),
      reason,
      h("div", { class: "approval-buttons" }, editArgs, reject, approve),
      error,
    );
    const waitingText = h("span", {}, "Waiting for a reviewer");
    const waiting = h(
      "p",
      { class: "approval-waiting", dataset: { testid: "approval-waiting" } },
      h("span", { class: "spinner", "aria-hidden": "true" }),
      waitingText,
    );
    const decision = h("div", { class: "approval-decision", dataset: { testid: "approval-decision" } });
    const statusPill = h("span", { class: "approval-status", dataset: { testid: "approval-status" } });
    const el = h(
      "article",
      { class: "approval-card", tabindex: "-1", dataset: { testid: "approval-card", approvalId: id } },
      h(
        "header",
        { class: "approval-head" },
        h("span", { class: "approval-icon" }, icon("shield")),
        h("div", { class: "approval-heading" }, tool, h("div", { class: "approval-sub" }, agent, " · ", time)),
        statusPill,
      ),
      args,
      argsEditor,
      actions,
      waiting,
      decision,
    );
    // The arguments as edited, when the reviewer changed them; else undefined.
    const editedArguments = () => {
      if (argsEditor.hidden) return undefined;
      const parsed = JSON.parse(argsEditor.value);
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("The arguments must be a JSON object.");
      return prettyJson(parsed) === prettyJson(current.args) ? undefined : parsed;
    };
    editArgs.addEventListener("click", () => {
      argsEditor.value = prettyJson(current.args);
      argsEditor.hidden = false;
      args.hidden = true;
      editArgs.hidden = true;
      argsEditor.focus();
    });
    argsEditor.addEventListener("input", () => {
      // An earlier complaint about the text is about text that is gone.
      const local = this.cardState.get(id) || {};
      if (local.error && !local.busy) this.cardState.set(id, { busy: null, error: null });
      patch(current);
    });
    const submit = (decisionValue) => {
      const local = this.cardState.get(id) || {};
      if (local.busy) return;
      let edited;
      try {
        edited = decisionValue === "approve" ? editedArguments() : undefined;
      } catch (err) {
        this.cardState.set(id, { busy: null, error: err instanceof SyntaxError ? "The arguments are not valid JSON." : err.message });
        patch(current);
        return;
      }
      this.cardState.set(id, { busy: decisionValue, error: null });
      patch(current);
      this.actions
        .decide(id, decisionValue, reason.value.trim(), edited)
        .then(() => this.cardState.set(id, { busy: null, error: null }))
        .catch((err) => this.cardState.set(id, { busy: null, error: err.message || String(err) }))
        .finally(() => patch(current));
    };
    approve.addEventListener("click", () => submit("approve"));
    reject.addEventListener("click", () => submit("reject"));
    reason.addEventListener("keydown", (event) => {
      // Ctrl/Cmd+Enter in the reason box rejects (the reason is what the model is told).
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        submit("reject");
      }
    });

    let current = approval;
    const patch = (a) => {
      current = a;
      el.dataset.status = a.status;
      setText(tool, a.toolName);
      setText(agent, a.agent ? `requested by ${a.agent}` : "requested");
      setTime(time, a.requestedAt);
      setText(args, prettyJson(a.args));
      const pending = a.status === "pending";
      // Who decides the call (docs/protocol.md §3 "Who decides"): the buttons only for them.
      const canDecide = this.actions.canDecide(a);
      setText(waitingText, a.decidedBy === "user" ? "Waiting for the user to confirm" : "Waiting for a reviewer");
      const local = this.cardState.get(a.approvalId) || {};
      actions.hidden = !(pending && canDecide);
      waiting.hidden = !(pending && !canDecide);
      approve.disabled = reject.disabled = reason.disabled = argsEditor.disabled = Boolean(local.busy);
      editArgs.hidden = !(pending && canDecide && a.editable) || !argsEditor.hidden;
      if (!pending) {
        argsEditor.hidden = true;
        args.hidden = false;
      }
      let changed = false;
      try {
        changed = !argsEditor.hidden && prettyJson(JSON.parse(argsEditor.value)) !== prettyJson(a.args);
      } catch {
        changed = !argsEditor.hidden; // unparsable text is a change; approving says why not
      }
      setText(approve, local.busy === "approve" ? "Approving…" : changed ? "Approve with changes" : "Approve");
      setText(reject, local.busy === "reject" ? "Rejecting…" : "Reject");
      setText(error, local.error || "");
      error.hidden = !local.error;
      setText(statusPill, { pending: "pending", approved: "approved", rejected: "rejected", superseded: "no longer needed", expired: "expired" }[a.status] || a.status);
      decision.hidden = pending;
      if (!pending) {
        clear(decision);
        if (a.status === "superseded") {
          const ended = { cancelled: "stopped", failed: "could not be finished" }[a.outcome] || "over";
          decision.append(`No decision: the answer was ${ended} first.`);
        } else {
          decision.append(
            h("strong", {}, a.status === "approved" ? "Approved" : "Rejected"),
            a.reviewer ? ` by ${a.reviewer}` : a.rule ? ` by the rule ${a.rule}` : "",
            a.decidedAt ? " at " : "",
            a.decidedAt ? timeEl(a.decidedAt) : "",
          );
          if (a.edited) {
            decision.append(
              h("div", { class: "approval-edited", dataset: { testid: "approval-edited" } }, "with changed arguments:"),
              h("pre", { class: "approval-args" }, prettyJson(a.edited)),
            );
          }
          if (a.reason) {
            decision.append(h("blockquote", { class: "approval-reason-text", dataset: { testid: "approval-decision-reason" } }, a.reason));
          }
        }
      }
    };
    return { el, patch };
  }
}

// -- from the package's items to the view's entries ---------------------------------------------

const USER_STATES = { started: "sent", staged: "staged", queued: "queued", delivered: "delivered", dropped: "dropped" };
let nextVersion = 1;
// key -> {deps, entry}: an entry is rebuilt (and gets a new version) only when one of the
// package objects it was made from is a different object.
const entries = new Map();

function cachedIn(threadId, key, deps, build) {
  const slot = `${threadId}|${key}`;
  const hit = entries.get(slot);
  if (hit && hit.deps.length === deps.length && hit.deps.every((dep, i) => dep === deps[i])) return hit.entry;
  const entry = { ...build(), key, v: nextVersion++ };
  entries.set(slot, { deps, entry });
  return entry;
}

function noticeText(item) {
  switch (item.event) {
    case "agent.changed":
      return { tone: "info", text: `Handed off to ${item.agent}` };
    case "run.suspended":
      return { tone: "warn", text: "Paused while nobody was watching; it goes on when you come back." };
    case "run.recovered":
      return { tone: "warn", text: "The assistant was interrupted and picked up where it left off." };
    case "run.failed": {
      const error = item.error || {};
      return { tone: "error", text: `The answer could not be finished: ${error.message || "something went wrong"}${error.code ? ` (${error.code})` : ""}` };
    }
    default:
      return { tone: "muted", text: "Stopped." };
  }
}

/** The view's entries for a thread state, in order: the approvals of one pause share a group. */
export function viewItems(state) {
  const cached = (key, deps, build) => cachedIn(state.threadId, key, deps, build);
  const out = [];
  const groups = new Map(); // group key -> approval items
  const approvalsByCall = new Map();
  for (const item of state.items) {
    if (item.kind !== "approval") continue;
    approvalsByCall.set(item.callId, item);
    const key = `a:${item.runId}:${item.checkpointVersion}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(item);
  }
  const lastOfRun = new Map();
  for (const item of state.items) {
    switch (item.kind) {
      case "input":
        out.push(cached(`u:${item.seq}`, [item], () => ({ kind: "user", text: item.text, state: USER_STATES[item.status], runId: item.runId })));
        break;
      case "message":
        // An aborted message will never complete: its partial text goes (docs/protocol.md §6);
        // a stopped one keeps what it streamed.
        if (item.status === "aborted") continue;
        out.push(
          cached(`m:${item.id}`, [item, item.runId ? state.runs[item.runId]?.supersededBy : null], () => ({
            kind: "assistant", messageId: item.id, text: item.text, agent: item.agent || null, streaming: item.status === "streaming",
            stopped: item.status === "stopped", runId: item.runId,
            replaced: Boolean(item.runId && state.runs[item.runId]?.supersededBy),
          })),
        );
        break;
      case "reasoning":
        out.push(cached(`r:${item.id}`, [item], () => ({ kind: "reasoning", text: item.text, streaming: item.status === "streaming", runId: item.runId })));
        break;
      case "tool": {
        const approval = approvalsByCall.get(item.id) ?? null;
        out.push(
          cached(`t:${item.id}`, [item, approval], () => ({
            kind: "tool", callId: item.id, toolName: item.toolName, args: item.arguments, output: item.output,
            hasOutput: item.output !== null, needsApproval: Boolean(approval),
            decision: approval?.status === "rejected" || approval?.status === "expired" ? "reject" : approval?.status === "approved" ? "approve" : null,
            runId: item.runId,
          })),
        );
        break;
      }
      case "approval": {
        const key = `a:${item.runId}:${item.checkpointVersion}`;
        const members = groups.get(key);
        if (members[0] !== item) continue; // the group sits where its first approval is
        out.push(
          cached(key, members, () => ({
            kind: "approvals", runId: item.runId,
            approvals: members.map((a) => ({
              approvalId: a.id, callId: a.callId, toolName: a.toolName, args: a.arguments, agent: a.agent || null,
              requestedAt: a.requestedAt, status: a.status, reason: a.reason, reviewer: a.reviewer, decidedAt: a.decidedAt,
              outcome: a.outcome, decidedBy: a.decidedBy ?? null, reviewerRoles: a.reviewerRoles ?? [], rule: a.rule ?? null,
              editable: a.argumentsEditable === true, edited: a.editedArguments ?? null,
            })),
          })),
        );
        break;
      }
      default:
        out.push(cached(`n:${item.seq}`, [item], () => ({ kind: "notice", ...noticeText(item) })));
    }
    if (item.runId) lastOfRun.set(item.runId, out.length);
  }
  // A final output no message carried (a structured output, say) is shown after its run.
  const finals = [];
  for (const run of Object.values(state.runs)) {
    if (run.status !== "completed" || !run.finalOutput || run.finalOutput === run.lastText) continue;
    finals.push([lastOfRun.get(run.runId) ?? out.length, cached(`f:${run.runId}`, [run.finalOutput], () => ({
      kind: "assistant", messageId: null, text: run.finalOutput, agent: run.agent, streaming: false, runId: run.runId,
    }))]);
  }
  for (const [index, entry] of finals.sort((a, b) => b[0] - a[0])) out.splice(index, 0, entry);
  return out;
}

/** The run status badge. */
export function renderStatusBadge(el, state) {
  const status = state ? state.status : "idle";
  el.dataset.status = status;
  setText(el, STATUS_LABELS[status] || status);
  el.hidden = !state || status === "idle";
}
