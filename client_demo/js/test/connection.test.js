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

/** A window and a document that keep their listeners, so the test can fire browser events. */
function fakeBrowser() {
  const target = () => {
    const listeners = new Map();
    return {
      listeners,
      addEventListener(name, listener) {
        if (!listeners.has(name)) listeners.set(name, new Set());
        listeners.get(name).add(listener);
      },
      removeEventListener(name, listener) {
        listeners.get(name)?.delete(listener);
      },
      dispatch(name) {
        for (const listener of listeners.get(name) ?? []) listener({ type: name });
      },
    };
  };
  const browser = { window: target(), document: { ...target(), visibilityState: "visible" } };
  globalThis.window = browser.window;
  globalThis.document = browser.document;
  return browser;
}

test("after a refused token, renew(token) watches the browser again: coming back online reconnects at once", async (t) => {
  const browser = fakeBrowser();
  t.after(() => {
    delete globalThis.window;
    delete globalThis.document;
  });
  const net = fakeNetwork();
  // A back-off far longer than the test: only the `online` event can bring the next socket.
  const connection = connect({ WebSocket: net.WebSocket, token: "old", backoff: { baseMs: 600_000, capMs: 600_000 } });
  connection.open();
  await settle();
  net.sockets[0].onclose({ code: 4001, reason: "unauthorized" });
  assert.equal(connection.status, "unauthorized");

  await connection.renew("new");
  await settle();
  assert.equal(net.sockets.length, 2, "the new token connects");
  net.sockets[1].onclose({ code: 1006, reason: "" }); // the network went away
  assert.equal(connection.status, "offline");

  browser.window.dispatch("online");
  await settle();
  assert.equal(net.sockets.length, 3, "reconnected on `online`, not after the back-off");
  assert.equal(connection.status, "connecting");
  assert.equal(browser.window.listeners.get("online").size, 1, "its listener attached once");
  connection.close();
  assert.equal(browser.window.listeners.get("online").size, 0, "close() removes it");
});
