// One logical connection to the gateway over a succession of WebSockets: hello, request/ack
// matching, replies to the server's pings, a watch on silence, reconnects with jittered
// exponential back-off, and token renewal on the open socket. It knows nothing about
// threads: the client resubscribes from its cursors whenever a new socket is welcomed.
// Wire contract: docs/protocol.md §2 (transport), §3 (hello, token expiry), §7 (close codes).

import { backoffDelay } from "./backoff.js";
import { Emitter } from "./emitter.js";
import { expiresIn, renewalDelay } from "./token.js";

export const PROTOCOL = 1;
const OPEN = 1;
// Timers wrap their delay to 32 signed bits (browsers and Node alike), so a longer delay
// would fire at once: a token that lives for weeks is looked at again after this.
const MAX_TIMER_MS = 2 ** 31 - 1;

/** A request the gateway refused (`error` frame), or one that could not be sent or answered. */
export class GatewayError extends Error {
  /** @param {string} code a §7 error code, or "offline", "disconnected", "timeout" @param {string} message */
  constructor(code, message, frame = null) {
    super(message);
    this.name = "GatewayError";
    this.code = code;
    this.frame = frame;
  }
}

/**
 * @typedef {"idle" | "connecting" | "online" | "offline" | "unauthorized" | "closed"} ConnectionStatus
 * idle: not started; connecting: socket opening or waiting for welcome; online: welcomed;
 * offline: waiting to retry; unauthorized: the token was refused and no new one came;
 * closed: `close()` was called.
 *
 * @typedef {object} ConnectionOptions
 * @property {string} url                     ws:// or wss:// URL of /v1/ws
 * @property {string | (() => string | Promise<string>)} token  a token, or a function giving one
 * @property {() => string | null | Promise<string | null>} [getToken]  supplies a fresh token to renew
 *   with (null: there is none, the connection ends as "unauthorized"); without
 *   it a token expires with its connection
 * @property {any} [WebSocket]                a WebSocket constructor (default globalThis.WebSocket;
 *   in Node pass the `ws` package's)
 * @property {import("./backoff.js").BackoffOptions} [backoff]
 * @property {number} [requestTimeoutMs]      how long a request waits for its answer (default 30 s)
 * @property {number} [silenceFactor]         reconnect after this many heartbeat periods without a
 *   frame, whatever the probes say (default 2.5)
 * @property {number} [probeTimeoutMs]        how long a ping of the client's may go unanswered before
 *   the socket counts as dead (default: half a heartbeat, at most 5 s)
 * @property {number} [connectTimeoutMs]      give up on a socket not welcomed by then (default 15 s)
 * @property {("reasoning" | "usage")[]} [omit] added events this view does not show, left out of
 *   every subscription by the gateway (§3 `omit`)
 */

export class Connection extends Emitter {
  /** @param {ConnectionOptions} options */
  constructor(options) {
    super();
    this.url = options.url;
    this.tokenSource = options.token;
    this.getToken = options.getToken ?? (typeof options.token === "function" ? options.token : null);
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    if (!this.WebSocket) throw new TypeError("no WebSocket implementation: pass options.WebSocket");
    this.backoff = options.backoff ?? {};
    this.requestTimeoutMs = options.requestTimeoutMs ?? 30_000;
    this.silenceFactor = options.silenceFactor ?? 2.5;
    this.probeTimeoutMs = options.probeTimeoutMs ?? null;
    // When the client's own ping went out, while no frame has come since: one at a time.
    this.probeSentAt = 0;
    this.connectTimeoutMs = options.connectTimeoutMs ?? 15_000;
    /** @type {string[]} added events to leave out of every subscription (§3 `omit`) */
    this.omit = options.omit ?? [];
    /** @type {string | null} */
    this.token = typeof options.token === "string" ? options.token : null;
    this.tokenReceivedAt = Date.now();
    /** @type {ConnectionStatus} */
    this.status = "idle";
    this.ws = null;
    /** @type {any} the newest `welcome` */
    this.welcome = null;
    this.attempt = 0;
    this.pending = new Map();
    this.nextId = 1;
    this.lastFrameAt = 0;
    this.timers = { retry: null, watch: null, renew: null, connect: null };
    this.authError = null;
    this.refreshedAfterRefusal = false;
    this.retryAt = null;
    // Counts connect attempts: an attempt still waiting for its token when a newer one starts
    // (or `close()` is called) sees the count moved on and gives up.
    this.connectGeneration = 0;
    // Whether the browser's online/offline/visibility listeners are attached (`_watchBrowser`).
    this.watchingBrowser = false;
    // sockets: WebSockets opened; connects: welcomes to a first hello; reconnects: connects
    // after the first; renewals: welcomes to a hello on an open socket; silences: sockets
    // given up for lack of frames.
    this.stats = { sockets: 0, connects: 0, reconnects: 0, renewals: 0, silences: 0 };
  }

  /** Start connecting (and keep reconnecting until `close()`). */
  open() {
    if (this.status !== "idle" && this.status !== "unauthorized" && this.status !== "closed") return;
    this.refreshedAfterRefusal = false;
    this._connect();
  }

  /**
   * Disconnect for good. The gateway only stops delivering: runs go on (or suspend, per their
   * `on_disconnect`), unlike a `run.cancel` which stops the run itself.
   */
  close() {
    this.connectGeneration += 1; // an attempt waiting for its token must not open a socket
    this._watchBrowser(false);
    this._clearTimers();
    this._detach(1000, "client closed");
    this._setStatus("closed");
  }

  get online() {
    return this.status === "online";
  }

  /** Cut the current socket as a network failure would, and reconnect at once. */
  reconnect() {
    if (this.status === "closed" || this.status === "idle") return;
    this._detach(4000, "client reconnects");
    this._scheduleReconnect(0);
  }

  /** Waiting to retry: try now instead (the network came back, the user asked). */
  reconnectNow() {
    if (this.status === "offline") this._connect();
  }

  /** Send a frame without an id (no answer expected). Returns false when not online. */
  send(frame) {
    if (!this.ws || this.ws.readyState !== OPEN || !this.welcome) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  /**
   * Send a frame with a fresh id; resolves with its `ack` (or `welcome` for a hello), rejects
   * with a GatewayError carrying the `error` frame's code.
   * @param {string} type
   * @param {Record<string, unknown>} [fields]
   * @returns {Promise<any>}
   */
  request(type, fields = {}) {
    if (!this.online) {
      if (!["connecting", "offline"].includes(this.status)) {
        return Promise.reject(new GatewayError("offline", "not connected to the gateway"));
      }
      // Connecting: send it once welcomed. A frame is only ever sent on a socket that is up,
      // so a request is never sent twice.
      return this._whenOnline(this.requestTimeoutMs).then(() => this.request(type, fields));
    }
    const id = `c${this.nextId++}`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new GatewayError("timeout", `no answer to ${type} in time`));
      }, this.requestTimeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.send({ ...fields, type, id });
    });
  }

  _whenOnline(timeoutMs) {
    return new Promise((resolve, reject) => {
      const done = (error) => {
        clearTimeout(timer);
        offStatus();
        if (error) reject(error);
        else resolve();
      };
      const timer = setTimeout(() => done(new GatewayError("offline", "not connected to the gateway in time")), timeoutMs);
      const offStatus = this.on("status", (status) => {
        if (status === "online") done();
        else if (status === "closed" || status === "unauthorized") done(new GatewayError("offline", "not connected to the gateway"));
      });
    });
  }

  /**
   * Renew now: use `token` (or ask `getToken` for one) and, on an open socket, send it in a
   * new hello. Resolves with the answering `welcome` (null when offline: the next connect
   * uses it).
   * @param {string} [token]
   */
  async renew(token) {
    const fresh = token ?? (this.getToken ? await this.getToken() : null);
    if (!fresh) throw new GatewayError("unauthorized", "no token to renew with");
    this._setToken(fresh);
    if (this.status === "unauthorized") {
      this._connect();
      return null;
    }
    if (!this.online) return null;
    const welcome = await this.request("hello", { protocol: PROTOCOL, token: fresh });
    return welcome;
  }

  // -- internals ----------------------------------------------------------------------------

  _setStatus(status) {
    if (this.status === status) return;
    this.status = status;
    this.emit("status", status, { attempt: this.attempt, retryAt: this.retryAt });
  }

  _setToken(token) {
    this.token = token;
    this.tokenReceivedAt = Date.now();
    if (this.online) this._scheduleRenewal();
  }

  async _currentToken() {
    if (this.token) return this.token;
    const source = this.tokenSource;
    const token = typeof source === "function" ? await source() : source;
    if (token) this._setToken(token);
    return token || null;
  }

  async _connect() {
    const generation = ++this.connectGeneration;
    // Every way of connecting (open, a reconnect, a renewal after a refused token) watches the
    // browser again: the paths ending as "unauthorized" stopped watching it.
    this._watchBrowser(true);
    this._clearTimers();
    this.retryAt = null;
    this._setStatus("connecting");
    let token;
    try {
      token = await this._currentToken();
    } catch {
      if (generation === this.connectGeneration) this._scheduleReconnect();
      return;
    }
    // Closed, or superseded by a newer attempt (close() then open() while the token was being
    // fetched), meanwhile: that one makes the socket, or none is wanted.
    if (generation !== this.connectGeneration || this.status !== "connecting") return;
    if (!token) {
      // The token supplier has none to give (signed out, or no longer offered): stop here.
      this._clearTimers();
      this._watchBrowser(false);
      this._setStatus("unauthorized");
      this.emit("unauthorized", this.authError || "no token to connect with");
      return;
    }
    let ws;
    try {
      ws = new this.WebSocket(this.url);
    } catch {
      this._scheduleReconnect();
      return;
    }
    this.ws = ws;
    this.welcome = null;
    this.authError = null;
    this.stats.sockets += 1;
    this.timers.connect = setTimeout(() => {
      // Stuck opening, or never welcomed: give this socket up and back off.
      if (this.ws === ws && !this.welcome) {
        this._detach(4000, "connect timeout");
        this._scheduleReconnect();
      }
    }, this.connectTimeoutMs);
    ws.onopen = () => {
      this.lastFrameAt = Date.now();
      const hello = { type: "hello", protocol: PROTOCOL, token };
      if (this.omit.length) hello.omit = this.omit;
      ws.send(JSON.stringify(hello));
    };
    ws.onmessage = (message) => this._onMessage(ws, message);
    ws.onclose = (event) => this._onClose(ws, event);
    ws.onerror = () => {
      /* a close event follows */
    };
  }

  _onMessage(ws, message) {
    if (ws !== this.ws) return;
    this.lastFrameAt = Date.now();
    this.probeSentAt = 0;
    let frame;
    try {
      frame = JSON.parse(typeof message.data === "string" ? message.data : String(message.data));
    } catch {
      return;
    }
    switch (frame.type) {
      case "ping":
        ws.send('{"type":"pong"}');
        return;
      case "pong":
        return;
      case "welcome":
        this._onWelcome(frame);
        return;
      case "ack":
      case "error": {
        // Kept for the 4001 close that follows: it says why.
        if (frame.type === "error" && frame.code === "unauthorized") this.authError = frame.message;
        const waiter = frame.ref ? this.pending.get(frame.ref) : null;
        if (waiter) {
          this.pending.delete(frame.ref);
          clearTimeout(waiter.timer);
          if (frame.type === "ack") waiter.resolve(frame);
          else waiter.reject(new GatewayError(frame.code, frame.message, frame));
          return;
        }
        break;
      }
      default:
        break;
    }
    this.emit("frame", frame);
  }

  _onWelcome(frame) {
    const waiter = frame.ref ? this.pending.get(frame.ref) : null;
    if (waiter && this.welcome) {
      // The answer to a renewing hello: same socket, same subscriptions, a new token.
      this.pending.delete(frame.ref);
      clearTimeout(waiter.timer);
      this.welcome = frame;
      this.stats.renewals += 1;
      waiter.resolve(frame);
      this.emit("renewed", frame);
      return;
    }
    clearTimeout(this.timers.connect);
    this.welcome = frame;
    if (this.stats.connects > 0) this.stats.reconnects += 1;
    this.stats.connects += 1;
    this.attempt = 0;
    this.refreshedAfterRefusal = false;
    this._startWatch(Math.max(0.2, frame.heartbeat_s || 20) * 1000);
    this._scheduleRenewal();
    this._setStatus("online");
    this.emit("welcome", frame);
  }

  _onClose(ws, event) {
    if (ws !== this.ws) return;
    this.ws = null;
    this.welcome = null;
    this._failPending();
    this.emit("disconnected", { code: event.code, reason: event.reason });
    if (event.code === 4001) {
      // The token was refused or expired on this socket. The same token cannot do better, a
      // new one may: ask once per refusal, so a token the gateway keeps refusing (a restarted
      // development gateway has a new secret) does not loop.
      if (this.getToken && !this.refreshedAfterRefusal) {
        this.refreshedAfterRefusal = true;
        this.token = null;
        this.tokenSource = this.getToken;
        this._connect();
        return;
      }
      this._clearTimers();
      this._watchBrowser(false);
      this._setStatus("unauthorized");
      this.emit("unauthorized", this.authError || "the gateway refused the token");
      return;
    }
    this._scheduleReconnect();
  }

  _scheduleReconnect(delay) {
    if (this.status === "closed") return;
    this._clearTimers();
    if (delay === undefined) {
      delay = backoffDelay(this.attempt, this.backoff);
      this.attempt += 1;
    }
    this.retryAt = Date.now() + delay;
    this._setStatus("offline");
    this.timers.retry = setTimeout(() => this._connect(), delay);
  }

  /**
   * The server pings every `heartbeat_s`. Once a period passes without a frame, this client
   * sends one ping of its own (a probe); when no frame answers it within `probeTimeoutMs`, or
   * after `silenceFactor` silent periods in any case, the socket is dead (a half-open TCP
   * connection can stay "open" for minutes): drop it and reconnect. One probe at a time, so
   * a slow server gets a ping per silent period, not one per tick.
   */
  _startWatch(heartbeatMs) {
    clearInterval(this.timers.watch);
    this.probeSentAt = 0;
    const probeMs = this.probeTimeoutMs ?? Math.min(5_000, heartbeatMs / 2);
    const tick = Math.max(50, Math.min(1_000, heartbeatMs / 8, probeMs / 4));
    this.timers.watch = setInterval(() => {
      if (!this.online) return;
      const now = Date.now();
      const silence = now - this.lastFrameAt;
      const unanswered = this.probeSentAt ? now - this.probeSentAt : 0;
      if (silence > heartbeatMs * this.silenceFactor || unanswered > probeMs) {
        this.stats.silences += 1;
        this.emit("silence", silence);
        this.reconnect();
      } else if (silence > heartbeatMs) {
        this._probe();
      }
    }, tick);
  }

  /** Ask the server for a frame (a `pong`), unless a probe is already waiting for one. */
  _probe() {
    if (!this.online || this.probeSentAt) return;
    this.probeSentAt = Date.now();
    this.send({ type: "ping" });
  }

  _scheduleRenewal() {
    clearTimeout(this.timers.renew);
    if (!this.getToken || !this.token) return;
    const delay = renewalDelay(this.token, this.tokenReceivedAt);
    if (delay === null) return;
    if (delay > MAX_TIMER_MS) {
      this.timers.renew = setTimeout(() => this._scheduleRenewal(), MAX_TIMER_MS);
      return;
    }
    this.timers.renew = setTimeout(() => this._renewLoop(), delay);
  }

  /**
   * In a browser: when the network goes (`offline`), the socket cannot work even if it still
   * looks open, so it is given up at once rather than after the missed heartbeats. When the
   * network comes back or a hidden tab is shown again, retry at once instead of waiting out
   * the back-off, and check that a socket that looks open still answers (a laptop's lid was
   * shut, the Wi-Fi changed).
   */
  _watchBrowser(on) {
    const win = globalThis.window;
    const doc = globalThis.document;
    if (!win?.addEventListener || !doc?.addEventListener) return;
    if (this.watchingBrowser === on) return; // each listener attached once, removed once
    this.watchingBrowser = on;
    this._onBrowserBack ??= () => {
      if (doc.visibilityState === "hidden") return;
      if (this.status === "offline") this._connect();
      else this._probe();
    };
    this._onBrowserOffline ??= () => {
      if (this.status !== "online" && this.status !== "connecting") return;
      this._detach(4000, "the network went away");
      this._scheduleReconnect();
    };
    const method = on ? "addEventListener" : "removeEventListener";
    win[method]("online", this._onBrowserBack);
    win[method]("offline", this._onBrowserOffline);
    doc[method]("visibilitychange", this._onBrowserBack);
  }

  async _renewLoop() {
    if (!this.online) return;
    const token = this.token;
    try {
      await this.renew();
    } catch (error) {
      this.emit("renewalFailed", error);
      // A token that could not be fetched, or a hello the gateway could not check yet
      // (`unavailable`): retry while the current token still holds.
      const left = token ? expiresIn(token) : null;
      if (this.online && this.token === token && left !== null && left > 1_000) {
        this.timers.renew = setTimeout(() => this._renewLoop(), Math.min(2_000, left / 2));
      }
    }
  }

  _detach(code, reason) {
    const ws = this.ws;
    this.ws = null;
    this.welcome = null;
    this._failPending();
    if (!ws) return;
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    try {
      ws.close(code, reason);
    } catch {
      /* already closed */
    }
  }

  _failPending() {
    for (const [id, waiter] of this.pending) {
      clearTimeout(waiter.timer);
      waiter.reject(new GatewayError("disconnected", "the connection dropped before the gateway answered"));
      this.pending.delete(id);
    }
  }

  _clearTimers() {
    clearTimeout(this.timers.retry);
    clearInterval(this.timers.watch);
    clearTimeout(this.timers.renew);
    clearTimeout(this.timers.connect);
  }
}
