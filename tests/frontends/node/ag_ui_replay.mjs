// Feeds @ag-ui/client's HttpAgent (1.0.0 or 0.0.59, through GatewayAgent) AG-UI streams given
// as text, through a stand-in fetch, so any stored log can be checked against the real
// client without a server. Config (JSON on stdin): {version, cases: [{full, cut, resume}]}:
// `full` is a whole stream; `cut` is its first part (the response then ends, as a dropped
// connection does) and `resume` what a connect from there answers. Prints, per case, the
// messages an undisturbed client holds and those of the one that dropped and connected.

import { makeGatewayAgent } from "../../../client_demo/js/src/ag-ui-agent.js";

let text = "";
for await (const chunk of process.stdin) text += chunk;
const config = JSON.parse(text);
const agui = config.version === "0.0.59" ? await import("ag-ui-client-0059") : await import("@ag-ui/client");
const GatewayAgent = makeGatewayAgent(agui);
process.on("unhandledRejection", () => {});

function serving(bodies) {
  return async () => {
    const body = bodies.shift();
    return new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } });
  };
}

async function settle(promise) {
  try {
    await promise;
    return null;
  } catch (error) {
    return String(error?.message ?? error);
  }
}

const results = [];
for (const item of config.cases) {
  const steady = new GatewayAgent({ url: "http://gw/v1/ag-ui/a", threadId: "t", fetch: serving([item.full]) });
  const steadyError = await settle(steady.runAgent());
  const dropped = new GatewayAgent({ url: "http://gw/v1/ag-ui/a", threadId: "t", fetch: serving([item.cut, item.resume]) });
  await settle(dropped.runAgent());
  const cursor = dropped.lastEventId;
  const resumeError = await settle(dropped.connectAgent());
  if (resumeError === null && dropped.lastEventId !== steady.lastEventId) {
    throw new Error(`cursor ${dropped.lastEventId} after the connect, ${steady.lastEventId} undisturbed`);
  }
  results.push({
    steady: steady.messages,
    resumed: dropped.messages,
    cursor,
    errors: [steadyError, resumeError].filter(Boolean),
  });
}
process.stdout.write(JSON.stringify(results) + "\n");
