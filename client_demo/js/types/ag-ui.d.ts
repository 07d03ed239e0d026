// Declarations of src/ag-ui.js and src/ag-ui-agent.js: an `@ag-ui/client` HttpAgent that
// resumes from the gateway's cursor (docs/protocol.md §12).
import type { HttpAgent, HttpAgentConfig, RunAgentParameters, AgentSubscriber, RunAgentResult } from "@ag-ui/client";

export interface GatewayAgentConfig extends HttpAgentConfig {
  /** The seq to resume from (a `lastEventId` kept from an earlier session), if any. */
  lastEventId?: string | number | null;
}

export declare class GatewayAgent extends HttpAgent {
  constructor(config: GatewayAgentConfig);
  /** The seq of the newest stored event all of whose AG-UI events this agent applied, or
   * null before the first. */
  lastEventId: string | null;
  /** `<url>/connect`. */
  readonly connectUrl: string;
  /** Follow the conversation from `lastEventId` (the whole conversation when null, or when
   * `threadId` has changed since), then live. */
  connectAgent(parameters?: RunAgentParameters, subscriber?: AgentSubscriber): Promise<RunAgentResult>;
  /** Cancel the conversation's run on the gateway; whether a run was active. */
  stopRun(): Promise<boolean>;
  /** A copy with the same cursor, which from then on follows its own responses. */
  clone(): GatewayAgent;
}

/** The class for a given `@ag-ui/client` module (1.0, or 0.0.x as CopilotKit ships it). */
export declare function makeGatewayAgent(agui: typeof import("@ag-ui/client")): typeof GatewayAgent;
