// AG-UI on the gateway in one import: `GatewayAgent`, an `@ag-ui/client` HttpAgent that
// resumes from a cursor (`connectAgent()`) and stops runs on the gateway (`stopRun()`).
// Needs `@ag-ui/client` (an optional peer dependency of this package).
import * as agui from "@ag-ui/client";

import { makeGatewayAgent } from "./ag-ui-agent.js";

export { makeGatewayAgent };
export const GatewayAgent = makeGatewayAgent(agui);
