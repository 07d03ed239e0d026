// Declarations for agents-ws-gateway-client/react (src/react.js).

import type { Approval, ConnectionStatus, GatewayClient, ThreadState } from "./index.js";

export interface UseThread {
  /** the thread followed: the argument, or the thread the first `send` created */
  threadId: string | null;
  state: ThreadState;
  connection: ConnectionStatus;
  /** the last failed action's error, cleared by the next action */
  error: Error | null;
  /** starts a run, or is staged or queued behind the thread's current one (run.input) */
  send(input: string): Promise<{ disposition: "started" | "staged" | "queued"; runId: string; threadId?: string }>;
  approve(approvalId: string): Promise<Approval>;
  reject(approvalId: string, reason?: string): Promise<Approval>;
  /** stops the thread's active run; the connection stays */
  cancel(): Promise<unknown>;
}

export declare function useThread(client: GatewayClient, threadId: string | null | undefined): UseThread;
