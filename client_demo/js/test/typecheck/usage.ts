// Compiled (never run) by test/types.test.js: the declarations describe the package's use.
import { GatewayClient, messages, webStorageStore } from "agents-ws-gateway-client";
import type { ClientFrame, EventDataMap, EventFrame, ServerFrame, ThreadState } from "agents-ws-gateway-client";
import { useThread } from "agents-ws-gateway-client/react";

declare const storage: Storage;

const client = new GatewayClient({ url: "wss://gateway.example/v1/ws", token: async () => "jwt", store: webStorageStore(storage) });
client.on("event", (frame: EventFrame, state: ThreadState) => {
  if (frame.event === "message.delta") {
    const delta: string = frame.data.delta;
    void delta;
  }
  void messages(state)[0]?.text;
});
client.on("thread:t_1", (state) => void state.activeRunId);

const hello: ClientFrame = { type: "hello", protocol: 1, token: "jwt" };
// @ts-expect-error: `run.start` needs an input
const broken: ClientFrame = { type: "run.start" };
const completed: EventDataMap["message.completed"] = { message_id: "m_1", text: "done" };

function onFrame(frame: ServerFrame): string {
  switch (frame.type) {
    case "subscribed":
      return frame.epoch;
    case "event":
      return frame.thread_id;
    default:
      return frame.type;
  }
}

const hook = useThread(client, null);
void hook.send("hello").then((ack) => ack.disposition);
void [hello, broken, completed, onFrame];
