// The connection's timing, where a real gateway cannot set the pace: a fake WebSocket the test
// opens and closes by hand, and a token that arrives when the test says.

import assert from "node:assert/strict";
import { afterEach, test } from "node:test";
import { Connection } from "../src/index.js";

const CONNECTING = 0;
const CLOSED = 3;

/** A WebSocket constructor that only records: the test plays the server's part. */
function fakeNetwork() {
  const sockets = [];
  class FakeWebSocket {
    constructor(url) {
      this.url = url;
      this.readyState = CONNECTING;
      this.sent = [];
      sockets.push(this);
    }
    send(data) {
      this.sent.push(data);
    }
    close() {
      this.readyState = CLOSED;
    }
  }
  return { WebSocket: FakeWebSocket, sockets, open: () => sockets.filter((s) => s.readyState !== CLOSED) };
}

/** A token source whose answers the test hands out: `give(token)` resolves every pending ask. */
function slowToken() {
  const waiting = [];
  return {
    token: () => new Promise((resolve) => waiting.push(resolve)),
    give(token) {
      for (const resolve of waiting.splice(0)) resolve(token);
    },
  };
}

const connections = [];

/** A Connection on the fake network, closed after its test whatever the test's outcome. */
function connect(options) {
  const connection = new Connection({ url: "ws://gateway.test/v1/ws", ...options });
  connections.push(connection);
  return connection;
}

afterEach(() => {
  for (const connection of connections.splice(0)) connection.close();
});

/** Let pending promise callbacks (a token arriving, `_connect` going on) run. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

test("close() then open() while the token is being fetched opens one socket, and close() leaves none", async () => {
  const net = fakeNetwork();
  const tokens = slowToken();
  const connection = connect({ WebSocket: net.WebSocket, token: tokens.token });
  connection.open();
  connection.close();
  connection.open();
  tokens.give("t1"); // both attempts get their token now: only the newer one may connect
  await settle();
  assert.equal(net.sockets.length, 1, "one socket opened");
  assert.equal(connection.ws, net.sockets[0]);
  connection.close();
  assert.deepEqual(net.open(), [], "no socket left open");
  assert.equal(connection.status, "closed");
});
