// agents-ws-gateway-client: a client for the gateway's WebSocket protocol (docs/protocol.md).
export { GatewayClient } from "./client.js";
export { Connection, GatewayError, PROTOCOL } from "./connection.js";
export { memoryStore, webStorageStore } from "./cursors.js";
export { backoffDelay } from "./backoff.js";
export { mayDecide } from "./decide.js";
export { decodeClaims, renewalDelay, expiresIn } from "./token.js";
export { applyEvent, applySubscribed, emptyThread, isTerminal, messages, pendingApprovals } from "./thread.js";
