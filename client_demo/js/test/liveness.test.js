// How soon the client notices a connection that no longer works: a server gone silent (a
// half-open TCP connection, where nothing tells either end) and, in browsers, the `offline`
// event (tests/browser/test_offline.py).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { GatewayClient } from "../src/index.js";
import { startGateway, trackedWebSocket, waitFor } from "./support/gateway.js";

const HEARTBEAT_S = 2;
let gateway;
let client;

before(async () => {
  gateway = await startGateway({ GATEWAY_HEARTBEAT_S: String(HEARTBEAT_S) });
});

after(async () => {
  client?.close();
  await gateway?.stop();
});

test("a silent server is given up one probe after a missed heartbeat, with one ping", async () => {
  const net = trackedWebSocket();
  client = new GatewayClient({ url: gateway.ws, WebSocket: net.WebSocket, token: await gateway.token("alice") });
  await client.connect().ready();
  const socket = net.current();
  const pings = [];
  const send = socket.send.bind(socket);
  socket.send = (data, ...rest) => {
    if (JSON.parse(String(data)).type === "ping") pings.push(Date.now());
    return send(data, ...rest);
  };
  // The TCP connection stays open but nothing arrives any more, as when a network path dies.
  socket._socket.pause();
  const silence = await waitFor(client.connection, "silence", (ms) => ms, 30_000);
  // Past one heartbeat without the server's ping, one ping of its own; no answer within half
  // a heartbeat: the socket is dead. Waiting for 2.5 heartbeats took 40-50 s at the default 20.
  assert.ok(silence < HEARTBEAT_S * 1000 * 2.25, `noticed after ${silence} ms of silence`);
  assert.equal(pings.length, 1, `pings sent while silent: ${pings.length}`);
  await waitFor(client, "status", () => client.status === "online");
  assert.notEqual(net.current(), socket);
});
