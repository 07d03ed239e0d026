// Folds UI message chunks into a UIMessage with the AI SDK's own stream processor
// (`readUIMessageStream`, what `Chat` runs on every response), as pinned in this folder.
// Run by tests/frontends/test_ai_sdk.py:
//
//   node ai_sdk_fold.mjs '{"chunks": [...]}'
//
// Prints {"event":"done","message":…} with the folded message, or {"event":"done","error":…}
// with what the processor refused.

import { readUIMessageStream } from "ai";

const { chunks } = JSON.parse(process.argv[2]);
const stream = new ReadableStream({
  start(controller) {
    for (const chunk of chunks) controller.enqueue(chunk);
    controller.close();
  },
});
let message = null;
const errors = [];
try {
  for await (const folded of readUIMessageStream({
    stream,
    onError: (error) => errors.push(String(error?.message ?? error)),
  })) {
    message = folded;
  }
} catch (error) {
  errors.push(String(error?.message ?? error));
}
// The processor reports a chunk it refuses once the stream has been read.
await new Promise((resolve) => setTimeout(resolve, 50));
const result = errors.length ? { error: errors.join("; ") } : { message };
process.stdout.write(`${JSON.stringify({ event: "done", ...result })}\n`);
