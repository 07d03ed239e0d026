// A real gateway process for the tests: `python -m gateway serve --port 0` on an ephemeral
// port, in development mode (tokens from POST /v1/dev/token) with its own SQLite file.

import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

/** The Python that runs the gateway: GATEWAY_PYTHON, else the project's .venv, else python3. */
function python() {
  if (process.env.GATEWAY_PYTHON) return process.env.GATEWAY_PYTHON;
  const venv = join(ROOT, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

/**
 * @param {Record<string, string>} [env] extra GATEWAY_* settings
 * @returns {Promise<{port: number, http: string, ws: string, token: Function, stop: Function, log: () => string}>}
 */
export async function startGateway(env = {}) {
  const dir = mkdtempSync(join(tmpdir(), "agw-js-"));
  const childEnv = { ...process.env, GATEWAY_DATABASE_URL: `sqlite:///${dir}/g.db`, GATEWAY_DEMO_DELAY_MS: "5", ...env };
  delete childEnv.GATEWAY_SECRET; // development mode: the tests mint their own tokens
  const child = spawn(python(), ["-m", "gateway", "serve", "--port", "0"], {
    cwd: ROOT,
    env: childEnv,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  const port = await new Promise((resolvePort, reject) => {
    const timer = setTimeout(() => reject(new Error(`gateway did not start:\n${log}`)), 60_000);
    const onData = (chunk) => {
      log += chunk;
      const match = /Uvicorn running on http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (match) {
        clearTimeout(timer);
        resolvePort(Number(match[1]));
      }
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("exit", (code) => reject(new Error(`gateway exited with ${code}:\n${log}`)));
  });
  const http = `http://127.0.0.1:${port}`;
  return {
    port,
    http,
    ws: `ws://127.0.0.1:${port}/v1/ws`,
    log: () => log,
    /** A development token. */
    async token(user, roles = ["user"], ttl_s = 3600) {
      const response = await fetch(`${http}/v1/dev/token`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ user, roles, ttl_s }),
      });
      if (!response.ok) throw new Error(`dev token: ${response.status} ${await response.text()}`);
      return (await response.json()).token;
    },
    /** The thread's stored log, read over HTTP. */
    async events(threadId, token) {
      const response = await fetch(`${http}/v1/threads/${threadId}/events?after_seq=0&limit=1000`, {
        headers: { authorization: `Bearer ${token}` },
      });
      if (!response.ok) throw new Error(`events: ${response.status}`);
      return response.json();
    },
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * The `ws` WebSocket, remembering every socket it opens so a test can cut one as the network
 * would (`terminate()`: no close handshake, the client only sees the TCP connection end).
 */
export function trackedWebSocket() {
  const sockets = [];
  class Tracked extends WebSocket {
    constructor(...args) {
      super(...args);
      sockets.push(this);
    }
  }
  return { WebSocket: Tracked, sockets, current: () => sockets[sockets.length - 1] };
}

/** Resolve when `predicate()` holds, checking on every change `subscribe` reports. */
export function waitFor(emitter, name, predicate, timeoutMs = 60_000) {
  return new Promise((resolvePromise, reject) => {
    const check = (...args) => {
      let value;
      try {
        value = predicate(...args);
      } catch (error) {
        off();
        clearTimeout(timer);
        reject(error);
        return;
      }
      if (value) {
        off();
        clearTimeout(timer);
        resolvePromise(value);
      }
    };
    const off = emitter.on(name, check);
    const timer = setTimeout(() => {
      off();
      reject(new Error(`timed out waiting for "${name}"`));
    }, timeoutMs);
    check();
  });
}
