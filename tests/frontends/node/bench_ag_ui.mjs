// Timings for bench/ag_ui.py, taken where a frontend sees events: when @ag-ui/client's
// HttpAgent (through GatewayAgent) applies them, and when a plain `ws` client parses the native
// protocol's frames. Config (argv[2], JSON): {scenario: "latency" | "connect", ...}; prints one
// JSON line.

import { randomUUID } from "node:crypto";

import * as agui from "@ag-ui/client";

import { makeGatewayAgent } from "../../../client_demo/js/src/ag-ui-agent.js";
import { nativeDeltas, now, report } from "./bench_native.mjs";

const config = JSON.parse(process.argv[2]);
const GatewayAgent = makeGatewayAgent(agui);

function agent(threadId, lastEventId = null) {
  return new GatewayAgent({
    url: config.url,
    threadId,
    headers: { Authorization: `Bearer ${config.token}` },
    lastEventId,
  });
}

// Each delta's seq and the wall-clock time (ms) it was applied.
async function aguiDeltas(threadId) {
  const runner = agent(threadId);
  const seen = [];
  runner.subscribe({ onTextMessageContentEvent: () => seen.push([Number(runner.lastEventId), now()]) });
  runner.messages = [{ id: randomUUID(), role: "user", content: config.input }];
  await runner.runAgent();
  return seen;
}

const scenarios = {
  async latency() {
    const out = { agui: [], native: [] };
    for (let i = 0; i < config.rounds; i += 1) {
      const threadId = `bench-${randomUUID()}`;
      out.agui.push({ threadId, seen: await aguiDeltas(threadId) });
      out.native.push(await nativeDeltas(config.wsUrl, config.token, config.input));
    }
    return out;
  },

  async connect() {
    // A client that held the run up to `cursor` connects again: time to its last event
    // applied, and the same from the start of the thread.
    const times = { middle: [], start: [] };
    let messages;
    for (let i = 0; i < config.rounds; i += 1) {
      for (const [name, cursor] of [["middle", config.cursor], ["start", null]]) {
        const reader = agent(config.threadId, cursor);
        const begin = now();
        await reader.connectAgent();
        times[name].push(now() - begin);
        messages = reader.messages;
      }
    }
    return { times, chars: messages.at(-1)?.content?.length ?? 0 };
  },
};

report(await scenarios[config.scenario]());
