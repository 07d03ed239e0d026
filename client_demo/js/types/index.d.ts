// Declarations for agents-ws-gateway-client (src/index.js). The wire frames themselves are
// generated from docs/asyncapi.json into ./protocol.d.ts.

import type { Approval, ErrorFrame, EventFrame, ThreadSummary, WelcomeFrame } from "./protocol.js";

export * from "./protocol.js";

export declare const PROTOCOL: 1;

export type RunStatus = "idle" | "running" | "waiting_for_review" | "suspended" | "completed" | "failed" | "cancelled";

export interface InputItem {
  kind: "input";
  id: string;
  seq: number;
  runId: string | null;
  text: string;
  /**
   * staged/queued: sent while a run was paused or busy, waiting to be taken up; delivered: a
   * staged input the continued run took in; dropped: a staged input its run never took in, as
   * the run ended (cancelled, failed) without continuing
   */
  status: "started" | "staged" | "queued" | "delivered" | "dropped";
}

export interface MessageItem {
  kind: "message";
  /** message_id */
  id: string;
  seq: number;
  runId: string | null;
  agent: string;
  /** grows as deltas arrive; the whole text once completed; "" once aborted; what was
   * streamed once stopped (cut by a cancel, its text kept) */
  text: string;
  status: "streaming" | "completed" | "aborted" | "stopped";
  abortReason?: string | null;
  /** seen from its `message.started` (else its deltas are partial) */
  fromStart: boolean;
}

export interface ToolItem {
  kind: "tool";
  /** call_id */
  id: string;
  seq: number;
  runId: string | null;
  toolName: string;
  arguments: Record<string, unknown>;
  agent: string;
  output: string | null;
  status: "called" | "done" | "needs_reconciliation";
}

export interface ApprovalItem {
  kind: "approval";
  /** approval_id */
  id: string;
  seq: number;
  runId: string | null;
  callId: string;
  toolName: string;
  arguments: Record<string, unknown>;
  agent: string;
  status: "pending" | "approved" | "rejected" | "superseded" | "expired";
  reviewer: string | null;
  reason: string | null;
  expiresAt: string | null;
  requestedAt: string | null;
  decidedAt: string | null;
  /** the approvals of one pause share it */
  checkpointVersion: number | null;
  /** superseded: how the run ended first */
  outcome: string | null;
  /** who decides the call (docs/protocol.md §3 "Who decides"); null: a gateway without it */
  decidedBy: "user" | "reviewer" | "either" | null;
  /** roles of which a decider must hold one; empty: any */
  reviewerRoles: string[];
  /** a reviewer may approve it with edited arguments (§4 "Approve with edits") */
  argumentsEditable?: boolean;
  /** the arguments it was approved with, when a reviewer edited them */
  editedArguments?: Record<string, unknown> | null;
  /** the graph's approval rule that decided it by itself; null: a person or the system */
  rule?: string | null;
}

/** A model's reasoning summary (docs/protocol.md §6), its text growing as deltas arrive. */
export interface ReasoningItem {
  kind: "reasoning";
  /** reasoning_id */
  id: string;
  seq: number;
  runId: string | null;
  agent: string;
  text: string;
  /** aborted: the run stopped before the summary ended */
  status: "streaming" | "completed" | "aborted";
}

/** Tokens as the provider reported them. */
export interface TokenUsage {
  requests: number;
  input_tokens: number;
  output_tokens: number;
  total_tokens: number;
  cached_tokens: number;
  reasoning_tokens: number;
}

/** Something about the run itself worth showing in the timeline. */
export interface NoticeItem {
  kind: "notice";
  id: string;
  seq: number;
  runId: string | null;
  event: "agent.changed" | "run.suspended" | "run.recovered" | "run.failed" | "run.cancelled";
  agent?: string | null;
  reason?: string | null;
  error?: { code: string; message: string } | null;
}

export type Item = InputItem | MessageItem | ReasoningItem | ToolItem | ApprovalItem | NoticeItem;

export interface RunInfo {
  runId: string;
  status: RunStatus;
  agent: string | null;
  input: string | null;
  finalOutput: string | null;
  error: { code: string; message: string } | null;
  pausedReason: string | null;
  /** the run's last completed message */
  lastText: string | null;
  /** the run's tokens so far (`model.usage` summed; the run's totals once it ended) */
  usage: TokenUsage | null;
  /** the run whose answer this one replaced (`run.regenerate`) */
  supersedes: string | null;
  /** the run that replaced this one's answer: its items are an earlier version */
  supersededBy: string | null;
  /** the failed run this one goes on from (`run.retry`): its items come before this run's */
  retries: string | null;
  /** the run that retried this failed one */
  retriedBy: string | null;
}

/** One thread's events folded into plain data; a new object whenever something changed. */
export interface ThreadState {
  threadId: string;
  epoch: string | null;
  /** the last applied seq: the cursor */
  seq: number;
  headSeq: number;
  items: Item[];
  runs: Record<string, RunInfo>;
  runId: string | null;
  status: RunStatus;
  activeRunId: string | null;
  /** the thread's first input */
  title: string | null;
  /** messages whose streamed deltas did not add up to their completed text */
  mismatches: number;
}

export declare function emptyThread(threadId: string): ThreadState;
export declare function applyEvent(state: ThreadState, frame: EventFrame): ThreadState;
export declare function applySubscribed(
  state: ThreadState,
  frame: { epoch: string; head_seq: number; reset: boolean },
): ThreadState;
export declare function isTerminal(status: RunStatus): boolean;
export declare function messages(state: ThreadState): MessageItem[];
export declare function pendingApprovals(state: ThreadState): ApprovalItem[];

export interface CursorEntry {
  epoch: string | null;
  seq: number;
  state: ThreadState;
}

export interface CursorStore {
  get(threadId: string): CursorEntry | null;
  set(threadId: string, entry: CursorEntry): void;
  delete(threadId: string): void;
}

export declare function memoryStore(): CursorStore;
export declare function webStorageStore(storage: Storage, prefix?: string): CursorStore;

export interface BackoffOptions {
  baseMs?: number;
  capMs?: number;
  random?: () => number;
}

export declare function backoffDelay(attempt: number, options?: BackoffOptions): number;

/** Who reads an approval: their user id and roles, and the thread's owner. */
export interface ApprovalReader {
  user: string;
  roles: string[];
  owner?: string | null;
}

/**
 * Whether `reader` may decide `approval`, as far as the thread's events tell (docs/protocol.md §3
 * "Who decides"): show the Approve and Reject buttons only then. The gateway checks again.
 */
export declare function mayDecide(
  approval: Pick<ApprovalItem, "decidedBy" | "reviewerRoles">,
  reader: ApprovalReader,
): boolean;
export declare function decodeClaims(
  token: string,
): { exp?: number; iat?: number; sub?: string; tenant?: string; roles?: string[] } | null;
export declare function renewalDelay(token: string, receivedAt?: number, now?: number): number | null;
export declare function expiresIn(token: string, now?: number): number | null;

export type ConnectionStatus = "idle" | "connecting" | "online" | "offline" | "unauthorized" | "closed";

export interface ConnectionOptions {
  /** ws:// or wss:// URL of the gateway's /v1/ws */
  url: string;
  /** a token, or a function giving one (called again after the gateway refuses one) */
  token: string | (() => string | Promise<string>);
  /** supplies fresh tokens, sent on the open socket before the current one expires; null: none to give */
  getToken?: () => string | null | Promise<string | null>;
  /** a WebSocket constructor: globalThis.WebSocket by default; in Node, the `ws` package's */
  WebSocket?: unknown;
  backoff?: BackoffOptions;
  requestTimeoutMs?: number;
  /** reconnect after this many heartbeat periods without a frame, whatever the probes say (default 2.5) */
  silenceFactor?: number;
  /** a heartbeat period without a frame sends one ping; unanswered this long, the socket is dead (default: half a heartbeat, at most 5 s) */
  probeTimeoutMs?: number;
  connectTimeoutMs?: number;
  /** added events this view does not show, left out of every subscription (§3 `omit`) */
  omit?: ("reasoning" | "usage")[];
}

export interface ClientOptions extends ConnectionOptions {
  /** where each thread's cursor and state are kept (default: memory) */
  store?: CursorStore;
}

export declare class GatewayError extends Error {
  /** a docs/protocol.md §7 error code, or "offline", "disconnected", "timeout" */
  code: string;
  frame: ErrorFrame | null;
}

type Unsubscribe = () => void;

export declare class Connection {
  constructor(options: ConnectionOptions);
  status: ConnectionStatus;
  welcome: WelcomeFrame | null;
  stats: { sockets: number; connects: number; reconnects: number; renewals: number; silences: number };
  readonly online: boolean;
  open(): void;
  close(): void;
  reconnect(): void;
  reconnectNow(): void;
  retryAt: number | null;
  send(frame: Record<string, unknown>): boolean;
  /** while connecting, waits (up to requestTimeoutMs) to be welcomed before it sends */
  request(type: string, fields?: Record<string, unknown>): Promise<any>;
  renew(token?: string): Promise<WelcomeFrame | null>;
  on(name: string, listener: (...args: any[]) => void): Unsubscribe;
}

export interface ClientEvents {
  status: (status: ConnectionStatus, info: { attempt: number; retryAt: number | null }) => void;
  welcome: (welcome: WelcomeFrame) => void;
  renewed: (welcome: WelcomeFrame) => void;
  unauthorized: (message: string) => void;
  event: (frame: EventFrame, state: ThreadState) => void;
  thread: (state: ThreadState) => void;
  reset: (threadId: string) => void;
  inbox: (approvals: Approval[]) => void;
  /** the followed thread list (`subscribeThreads`), the most recently active first */
  threads: (threads: ThreadSummary[]) => void;
  error: (error: ErrorFrame | Error) => void;
}

export declare class GatewayClient {
  constructor(options: ClientOptions);
  readonly connection: Connection;
  readonly store: CursorStore;
  readonly status: ConnectionStatus;
  readonly welcome: WelcomeFrame | null;
  readonly inbox: Approval[];
  /** the followed thread list (`subscribeThreads`), the most recently active first */
  readonly threadList: ThreadSummary[];
  stats: { applied: number; duplicates: number; resets: number; gaps: number };
  subscribedFrom: Record<string, number>;
  connect(): this;
  /** disconnect; runs go on (use cancel to stop one) */
  close(): void;
  ready(): Promise<WelcomeFrame>;
  thread(threadId: string): ThreadState;
  createThread(metadata?: Record<string, unknown>): Promise<string>;
  subscribe(threadId: string): Promise<unknown>;
  unsubscribe(threadId: string): Promise<unknown>;
  forget(threadId: string): void;
  /** Rename and/or archive a thread (§4 `thread.update`): its owner or an admin. */
  updateThread(threadId: string, changes: { title?: string; archived?: boolean }): Promise<ThreadSummary>;
  renameThread(threadId: string, title: string): Promise<ThreadSummary>;
  /** `archived: false` brings the thread back */
  archiveThread(threadId: string, archived?: boolean): Promise<ThreadSummary>;
  /** Delete a thread with no active run (§4 `thread.delete`) and forget it here. */
  deleteThread(threadId: string): Promise<unknown>;
  /** Follow the caller's thread list across reconnects: `threadList` and the "threads" event. */
  subscribeThreads(options?: { archived?: boolean }): Promise<unknown>;
  startRun(run: {
    threadId?: string;
    input: string;
    agent?: string;
    onDisconnect?: "continue" | "suspend";
  }): Promise<{ threadId: string; runId: string }>;
  sendInput(threadId: string, input: string): Promise<{ disposition: "started" | "staged" | "queued"; runId: string }>;
  /** A new answer to the thread's last input, or to an edit of it (§4 `run.regenerate`). */
  regenerate(
    threadId: string,
    options?: { input?: string; runId?: string },
  ): Promise<{ threadId: string; runId: string; supersedes: string }>;
  /** A failed run, retried from its last checkpoint in a new run (§4 `run.retry`). */
  retry(
    runId: string,
  ): Promise<{ threadId: string; runId: string; retries: string; checkpointVersion: number | null }>;
  cancel(runId: string): Promise<unknown>;
  resume(runId: string): Promise<unknown>;
  decide(
    approvalId: string,
    decision: "approve" | "reject",
    reason?: string,
    options?: { arguments?: Record<string, unknown> },
  ): Promise<Approval>;
  /** Approve; with `edited`, with those arguments instead of the call's (§4). */
  approve(approvalId: string, edited?: Record<string, unknown>): Promise<Approval>;
  reject(approvalId: string, reason?: string): Promise<Approval>;
  subscribeInbox(): Promise<unknown>;
  on<K extends keyof ClientEvents>(name: K, listener: ClientEvents[K]): Unsubscribe;
  on(name: `thread:${string}`, listener: (state: ThreadState) => void): Unsubscribe;
}
