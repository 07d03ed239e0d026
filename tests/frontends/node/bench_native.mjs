// The native protocol's side of the frontend benchmarks (bench/ag_ui.py, bench/ai_sdk.py): a
// plain `ws` client on /v1/ws that parses every frame, timed on the same clock as the frontend
// clients it is compared with (this process's).

import { performance } from "node:perf_hooks";

import WebSocket from "ws";

// Wall-clock epoch ms with sub-millisecond resolution, comparable with the stored events' `ts`.
export const now = () => performance.timeOrigin + performance.now();

// Opens an authenticated connection, sends `first` once welcomed, and hands every parsed frame
// to `onFrame(frame, ws)` until it returns true.
function session(wsUrl, token, first, onFrame) {
  const ws = new WebSocket(wsUrl);
  return new Promise((resolve, reject) => {
    ws.on("error", reject);
    ws.on("open", () => ws.send(JSON.stringify({ type: "hello", protocol: 1, token })));
    ws.on("message", (raw) => {
      const frame = JSON.parse(raw.toString());
      if (frame.type === "welcome") ws.send(JSON.stringify(first));
      if (frame.type === "error") reject(new Error(`${frame.code}: ${frame.message}`));
      if (onFrame(frame)) {
        ws.close();
        resolve();
      }
    });
  });
}

// Starts a run of `input` and records each delta's seq and the time it was parsed.
export async function nativeDeltas(wsUrl, token, input) {
  const seen = [];
  let threadId;
  await session(wsUrl, token, { type: "run.start", id: "s", input }, (frame) => {
    if (frame.type !== "event") return false;
    threadId = frame.thread_id;
    if (frame.event === "message.delta") seen.push([frame.seq, now()]);
    return frame.event === "run.completed";
  });
  return { threadId, seen };
}

// Reads a thread from its start up to its first `run.completed`: ms from the subscribe, and the
// events parsed.
export async function nativeReplay(wsUrl, token, threadId) {
  let events = 0;
  let begin;
  const subscribe = { type: "thread.subscribe", id: "r", thread_id: threadId, after_seq: 0 };
  const sent = session(wsUrl, token, subscribe, (frame) => {
    if (frame.type === "welcome") begin = now();
    if (frame.type !== "event") return false;
    events += 1;
    return frame.event === "run.completed";
  });
  await sent;
  return { ms: now() - begin, events };
}

// Prints the result as one JSON line and exits once it is written: stdout is a pipe, written
// asynchronously, and an exit before the write drains cuts the line at 64 KiB.
export function report(result) {
  process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(0));
}
