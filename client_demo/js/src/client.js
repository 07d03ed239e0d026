// The gateway client: a Connection plus the threads it watches. For each thread it keeps the
// folded state and its cursor (epoch, seq) in a CursorStore, resubscribes from that cursor on
// every new socket, drops events it already applied, and reloads the thread when the gateway
// says the cursor cannot be honoured (`reset`). Actions are the client frames of
// docs/protocol.md §4, each resolving with its `ack`.

import { Connection, GatewayError } from "./connection.js";
import { memoryStore } from "./cursors.js";
import { Emitter } from "./emitter.js";
import { applyEvent, applySubscribed, emptyThread } from "./thread.js";

/**
 * @typedef {import("./connection.js").ConnectionOptions & {
 *   store?: import("./cursors.js").CursorStore,
 * }} ClientOptions
 *
 * Events (`client.on(name, listener)`, which returns the function that removes it):
 * - "status" (status, {attempt, retryAt}): the connection's status changed
 * - "welcome" (welcome): a socket was welcomed (first connect or reconnect)
 * - "renewed" (welcome): a new token was accepted on the open socket
 * - "unauthorized" (message): the token was refused and no new one came
 * - "event" (frame, state): a new event was applied to a thread
 * - "thread" (state): a thread's state changed; "thread:<id>" for one thread only
 * - "reset" (threadId): a thread's cursor could not be honoured; its view starts over
 * - "inbox" (approvals): the reviewer inbox changed
 * - "threads" (threads): the thread list (`subscribeThreads`) changed, newest activity first
 * - "error" (error frame): an error the gateway sent outside any request (a subscription
 *   the renewed token no longer allows, for example)
 */
export class GatewayClient extends Emitter {
  /** @param {ClientOptions} options */
  constructor(options) {
    super();
    this.store = options.store ?? memoryStore();
    this.connection = new Connection(options);
    /** @type {Map<string, {state: import("./thread.js").ThreadState, subscribed: boolean, live: boolean, restarting: boolean, saveQueued: boolean}>} */
    this.threads = new Map();
    this.inboxWanted = false;
    /** @type {Map<string, any>} approval_id -> approval */
    this.inboxApprovals = new Map();
    /** @type {{archived: boolean} | null} the thread list this client follows, if any */
    this.threadsWanted = null;
    /** @type {Map<string, any>} thread_id -> thread summary */
    this.threadSummaries = new Map();
    this.stats = { applied: 0, duplicates: 0, resets: 0, gaps: 0 };
    /** @type {Record<string, number>} the after_seq of each thread's latest subscribe */
    this.subscribedFrom = {};
    const c = this.connection;
    c.on("status", (...args) => this.emit("status", ...args));
    c.on("renewed", (welcome) => this.emit("renewed", welcome));
    c.on("unauthorized", (message) => this.emit("unauthorized", message));
    c.on("disconnected", () => {
      for (const entry of this.threads.values()) entry.live = false;
    });
    c.on("welcome", (welcome) => this._onWelcome(welcome));
    c.on("frame", (frame) => this._onFrame(frame));
  }

  /** Connect (and keep reconnecting until `close()`). Returns this client. */
  connect() {
    this.connection.open();
    return this;
  }

  /** Disconnect. Runs are not stopped: use `cancel(runId)` for that. */
  close() {
    this.connection.close();
  }

  get status() {
    return this.connection.status;
  }

  /** The newest `welcome` (user, tenant, roles, heartbeat_s), or null before one. */
  get welcome() {
    return this.connection.welcome;
  }

  /** Resolves once online (at once when already). */
  ready() {
    if (this.connection.online) return Promise.resolve(this.connection.welcome);
    return new Promise((resolve, reject) => {
      const offWelcome = this.connection.on("welcome", (w) => {
        offWelcome();
        offRefused();
        resolve(w);
      });
      const offRefused = this.connection.on("unauthorized", (message) => {
        offWelcome();
        offRefused();
        reject(new GatewayError("unauthorized", message));
      });
    });
  }

  /**
   * A thread's folded state: from memory, else from the store, else empty.
   * @param {string} threadId
   * @returns {import("./thread.js").ThreadState}
   */
  thread(threadId) {
    return this._entry(threadId).state;
  }

  // -- threads ------------------------------------------------------------------------------

  /** Create an empty thread; resolves with its id. @param {Record<string, unknown>} [metadata] */
  async createThread(metadata) {
    const ack = await this.connection.request("thread.create", metadata ? { metadata } : {});
    return ack.thread_id;
  }

  /**
   * Watch a thread: from now on, and across reconnects, its events are applied to its state
   * from the stored cursor. Resolves with the `ack` once subscribed (or at once when offline:
   * the subscription is made on the next connect).
   * @param {string} threadId
   */
  subscribe(threadId) {
    const entry = this._entry(threadId);
    entry.subscribed = true;
    if (!this.connection.online) return Promise.resolve(null);
    return this._subscribe(threadId);
  }

  /** Stop watching a thread. Its state and cursor stay stored. @param {string} threadId */
  unsubscribe(threadId) {
    const entry = this.threads.get(threadId);
    if (!entry) return Promise.resolve(null);
    entry.subscribed = false;
    entry.live = false;
    if (!this.connection.online) return Promise.resolve(null);
    return this.connection.request("thread.unsubscribe", { thread_id: threadId });
  }

  /**
   * Rename a thread and/or archive it (`archived: true`) or bring it back (§4 `thread.update`):
   * its owner or an admin. Resolves with the thread as lists show it.
   * @param {string} threadId
   * @param {{title?: string, archived?: boolean}} changes
   */
  async updateThread(threadId, { title, archived }) {
    const frame = { thread_id: threadId };
    if (title !== undefined) frame.title = title;
    if (archived !== undefined) frame.archived = archived;
    const ack = await this.connection.request("thread.update", frame);
    this._listThreads([ack.thread], []);
    return ack.thread;
  }

  /** @param {string} threadId @param {string} title */
  renameThread(threadId, title) {
    return this.updateThread(threadId, { title });
  }

  /** @param {string} threadId @param {boolean} [archived] false brings it back */
  archiveThread(threadId, archived = true) {
    return this.updateThread(threadId, { archived });
  }

  /**
   * Delete a thread that has no active run (§4 `thread.delete`), and forget what this client
   * kept of it.
   * @param {string} threadId
   */
  async deleteThread(threadId) {
    const ack = await this.connection.request("thread.delete", { thread_id: threadId });
    this.forget(threadId);
    this._listThreads([], [threadId]);
    return ack;
  }

  /**
   * Follow the caller's thread list (§4 `threads.subscribe`) across reconnects: `threadList`
   * and the "threads" event. `archived: true` follows the archived threads instead.
   * @param {{archived?: boolean}} [options]
   */
  subscribeThreads({ archived = false } = {}) {
    this.threadsWanted = { archived };
    if (!this.connection.online) return Promise.resolve(null);
    return this.connection.request("threads.subscribe", { archived });
  }

  /** The followed thread list, the most recently active first. */
  get threadList() {
    return [...this.threadSummaries.values()].sort((a, b) =>
      a.last_activity_at < b.last_activity_at ? 1 : a.last_activity_at > b.last_activity_at ? -1 : 0,
    );
  }

  /** Forget a thread's stored state and cursor (the next subscribe replays it whole). */
  forget(threadId) {
    this.threads.delete(threadId);
    this.store.delete(threadId);
  }

  // -- runs ---------------------------------------------------------------------------------

  /**
   * Start a run. Without `threadId` the gateway creates a thread; either way this client
   * watches the thread from the run's first event.
   * @param {{threadId?: string, input: string, agent?: string, onDisconnect?: "continue" | "suspend"}} run
   * @returns {Promise<{threadId: string, runId: string}>}
   */
  async startRun({ threadId, input, agent, onDisconnect }) {
    if (threadId) this._entry(threadId).subscribed = true;
    const frame = { input };
    if (threadId) frame.thread_id = threadId;
    if (agent) frame.agent = agent;
    if (onDisconnect) frame.on_disconnect = onDisconnect;
    const ack = await this.connection.request("run.start", frame);
    this._entry(ack.thread_id).subscribed = true;
    return { threadId: ack.thread_id, runId: ack.run_id };
  }

  /**
   * Send text to a thread, wherever its run stands (§4 `run.input`): it starts a run, is
   * staged into a paused one, or is queued behind a busy one.
   * @param {string} threadId
   * @param {string} input
   * @returns {Promise<{disposition: "started" | "staged" | "queued", runId: string}>}
   */
  async sendInput(threadId, input) {
    this._entry(threadId).subscribed = true;
    const ack = await this.connection.request("run.input", { thread_id: threadId, input });
    return { disposition: ack.disposition, runId: ack.run_id };
  }

  /**
   * A new answer to the thread's last input, or to `input`, an edit of it (§4
   * `run.regenerate`): a run that supersedes the last one, which must have finished.
   * @param {string} threadId
   * @param {{input?: string, runId?: string}} [options] runId: the run meant (refused unless last)
   * @returns {Promise<{threadId: string, runId: string, supersedes: string}>}
   */
  async regenerate(threadId, { input, runId } = {}) {
    this._entry(threadId).subscribed = true;
    const frame = { thread_id: threadId };
    if (input !== undefined) frame.input = input;
    if (runId) frame.run_id = runId;
    const ack = await this.connection.request("run.regenerate", frame);
    return { threadId: ack.thread_id, runId: ack.run_id, supersedes: ack.supersedes };
  }

  /**
   * Retry a failed run from its last checkpoint (§4 `run.retry`): a new run on the same thread
   * that answers the same input and repeats only the turn the run failed in. The failed run
   * stays failed; its thread state marks it `retriedBy` the new run.
   * @param {string} runId the failed run (the thread's last)
   * @returns {Promise<{threadId: string, runId: string, retries: string, checkpointVersion: number | null}>}
   */
  async retry(runId) {
    const ack = await this.connection.request("run.retry", { run_id: runId });
    this._entry(ack.thread_id).subscribed = true;
    return {
      threadId: ack.thread_id,
      runId: ack.run_id,
      retries: ack.retries,
      checkpointVersion: ack.checkpoint_version ?? null,
    };
  }

  /** Stop a run (not the connection). @param {string} runId */
  cancel(runId) {
    return this.connection.request("run.cancel", { run_id: runId });
  }

  /** Continue a suspended run without watching it. @param {string} runId */
  resume(runId) {
    return this.connection.request("run.resume", { run_id: runId });
  }

  /**
   * Decide an approval; resolves with the decided approval object.
   * @param {string} approvalId
   * @param {"approve" | "reject"} decision
   * @param {string} [reason] for a rejection, what the model is told
   * @param {{arguments?: Record<string, unknown>}} [options] arguments: approve with these
   *   instead of the call's (an approval whose `arguments_editable` is true, §4)
   */
  async decide(approvalId, decision, reason, { arguments: edited } = {}) {
    const frame = { approval_id: approvalId, decision };
    if (reason !== undefined) frame.reason = reason;
    if (edited !== undefined) frame.arguments = edited;
    const ack = await this.connection.request("approval.decide", frame);
    return ack.approval;
  }

  /**
   * @param {string} approvalId
   * @param {Record<string, unknown>} [edited] approve with these arguments instead (§4)
   */
  approve(approvalId, edited) {
    return this.decide(approvalId, "approve", undefined, edited === undefined ? {} : { arguments: edited });
  }

  /** @param {string} approvalId @param {string} [reason] */
  reject(approvalId, reason) {
    return this.decide(approvalId, "reject", reason);
  }

  // -- reviewer inbox -----------------------------------------------------------------------

  /** Watch the tenant's pending approvals (reviewers, admins), across reconnects. */
  subscribeInbox() {
    this.inboxWanted = true;
    if (!this.connection.online) return Promise.resolve(null);
    return this.connection.request("inbox.subscribe");
  }

  /** The pending approvals, oldest first. */
  get inbox() {
    return [...this.inboxApprovals.values()];
  }

  // -- internals ----------------------------------------------------------------------------

  _entry(threadId) {
    let entry = this.threads.get(threadId);
    if (!entry) {
      const stored = this.store.get(threadId);
      const state = stored ? { ...stored.state, epoch: stored.epoch, seq: stored.seq } : emptyThread(threadId);
      entry = { state, subscribed: false, live: false, restarting: false, saveQueued: false };
      this.threads.set(threadId, entry);
    }
    return entry;
  }

  _subscribe(threadId) {
    const { state } = this._entry(threadId);
    const frame = { thread_id: threadId, after_seq: state.seq };
    if (state.epoch) frame.epoch = state.epoch;
    this.subscribedFrom[threadId] = state.seq;
    return this.connection.request("thread.subscribe", frame).catch((error) => {
      // Not found or not allowed: stop asking on every reconnect.
      if (error.code === "not_found" || error.code === "forbidden") this._entry(threadId).subscribed = false;
      throw error;
    });
  }

  _onWelcome(welcome) {
    for (const [threadId, entry] of this.threads) {
      if (!entry.subscribed) continue;
      // Which thread a refusal is about: the frame answering a subscribe does not say.
      this._subscribe(threadId).catch((error) => this.emit("error", { ...(error.frame ?? { code: error.code, message: error.message }), thread_id: threadId }));
    }
    if (this.inboxWanted) this.connection.request("inbox.subscribe").catch((error) => this.emit("error", error.frame ?? error));
    if (this.threadsWanted) {
      this.connection
        .request("threads.subscribe", this.threadsWanted)
        .catch((error) => this.emit("error", error.frame ?? error));
    }
    this.emit("welcome", welcome);
  }

  _onFrame(frame) {
    switch (frame.type) {
      case "subscribed":
        return this._onSubscribed(frame);
      case "event":
        return this._onEvent(frame);
      case "inbox":
        this.inboxApprovals = new Map(frame.approvals.map((a) => [a.approval_id, a]));
        return this.emit("inbox", this.inbox);
      case "inbox.update":
        for (const id of frame.removed ?? []) this.inboxApprovals.delete(id);
        for (const approval of frame.added ?? []) this.inboxApprovals.set(approval.approval_id, approval);
        return this.emit("inbox", this.inbox);
      case "threads":
        this.threadSummaries = new Map(frame.threads.map((t) => [t.thread_id, t]));
        return this.emit("threads", this.threadList);
      case "threads.update":
        return this._listThreads(frame.threads ?? [], frame.removed ?? []);
      case "error":
        if (frame.thread_id && this.threads.has(frame.thread_id)) {
          // A subscription the token's roles no longer allow (§3): it has ended.
          const entry = this.threads.get(frame.thread_id);
          entry.subscribed = false;
          entry.live = false;
        }
        return this.emit("error", frame);
      default:
        return undefined;
    }
  }

  /** Changes to the followed list: from the gateway, or this client's own rename or delete. */
  _listThreads(threads, removed) {
    if (!this.threadsWanted) return;
    const archived = this.threadsWanted.archived;
    for (const id of removed) this.threadSummaries.delete(id);
    for (const thread of threads) {
      if (thread.archived === archived) this.threadSummaries.set(thread.thread_id, thread);
      else this.threadSummaries.delete(thread.thread_id);
    }
    this.emit("threads", this.threadList);
  }

  _onSubscribed(frame) {
    // A `subscribed` for a thread nobody asked for follows a run.start without thread_id.
    const entry = this._entry(frame.thread_id);
    entry.subscribed = true;
    entry.live = true;
    // After a reset the replay starts at the first event the log still stores, which need not
    // be seq 1 (retention may have removed the beginning): the first event may not follow.
    entry.restarting = Boolean(frame.reset);
    if (frame.reset) {
      this.stats.resets += 1;
      this.emit("reset", frame.thread_id);
    }
    this._setState(frame.thread_id, entry, applySubscribed(entry.state, frame));
  }

  _onEvent(frame) {
    const entry = this.threads.get(frame.thread_id);
    if (!entry || !entry.live) return; // a frame of a subscription this client has left
    const state = entry.state;
    if (frame.seq <= state.seq) {
      this.stats.duplicates += 1;
      return;
    }
    // The seq this frame follows: the one before it, or (after events this connection asked
    // to omit, §3) the one it names.
    const follows = frame.prev_seq ?? frame.seq - 1;
    const restarting = entry.restarting;
    entry.restarting = false;
    if (follows > state.seq && !restarting) {
      // §5 promises no gaps within a subscription, but a subscription need not start at this
      // state's cursor: acting on a thread this connection does not watch (run.input,
      // run.regenerate, run.retry, run.start with thread_id) subscribes it from the new run's
      // first event, after history this state may not hold (all of it when the state is
      // empty). Ask again from the cursor rather than show a thread with a hole in it.
      this.stats.gaps += 1;
      entry.live = false;
      this._subscribe(frame.thread_id).catch(() => {});
      return;
    }
    this.stats.applied += 1;
    const next = applyEvent(state, frame);
    this._setState(frame.thread_id, entry, next);
    this.emit("event", frame, next);
  }

  _setState(threadId, entry, state) {
    if (state === entry.state) return;
    entry.state = state;
    this._save(threadId, entry);
    this.emit("thread", state);
    this.emit(`thread:${threadId}`, state);
  }

  /** Store once per burst of events (a replay applies hundreds in one task). */
  _save(threadId, entry) {
    if (entry.saveQueued) return;
    entry.saveQueued = true;
    queueMicrotask(() => {
      entry.saveQueued = false;
      const { state } = entry;
      this.store.set(threadId, { epoch: state.epoch, seq: state.seq, state });
    });
  }
}
