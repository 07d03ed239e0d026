// The WebSocket to the gateway: hello, request/ack matching, heartbeats and automatic
// reconnects with exponential backoff and jitter. It knows nothing about threads: the app
// re-subscribes from its stored cursors whenever a new socket's `welcome` arrives. A renewing
// hello (a fresh token on the open socket) is answered by a `welcome` too, which changes
// nothing but the token and the roles: that one goes to `onRenewed` instead.

const PROTOCOL = 1;
const BACKOFF_BASE_MS = 500;
const BACKOFF_CAP_MS = 10_000;
const REQUEST_TIMEOUT_MS = 30_000;
const CLIENT_PING_MS = 15_000;

export class RequestError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

/**
 * status: "connecting" (socket opening or waiting for welcome), "online", "offline"
 * (waiting to retry), "unauthorized" (the token was refused: no more retries), "stopped".
 */
export class GatewayConnection {
  /**
   * refreshToken(message): called when the gateway refused the token (close 4001); resolves
   * with a new token to connect with, or null when there is none. A rejection means "not now":
   * the connection backs off and tries again.
   */
  constructor({ url, token, onFrame, onStatus, onWelcome, onRenewed, onAuthFailed, refreshToken }) {
    this.url = url;
    this.token = token;
    this.onFrame = onFrame;
    this.onStatus = onStatus;
    this.onWelcome = onWelcome;
    this.onRenewed = onRenewed;
    this.onAuthFailed = onAuthFailed;
    this.refreshToken = refreshToken;
    this.refreshed = false;
    this.authError = null;
    this.ws = null;
    this.status = "stopped";
    this.attempt = 0;
    this.retryTimer = null;
    this.retryAt = null;
    this.pending = new Map();
    this.nextId = 1;
    this.lastFrameAt = 0;
    this.heartbeatMs = 20_000;
    this.watchdog = null;
    this.welcome = null;
    // sockets: WebSockets opened; connects: welcomes to a first hello; renewals: welcomes to
    // a renewing hello on an open socket.
    this.stats = { sockets: 0, connects: 0, reconnects: 0, drops: 0, renewals: 0 };
    this.stopped = true;
    this._onlineEvent = () => this.reconnectNow();
    this._onVisible = () => {
      if (document.visibilityState === "visible" && this.status === "offline") this.reconnectNow();
    };
  }

  start() {
    this.stopped = false;
    window.addEventListener("online", this._onlineEvent);
    document.addEventListener("visibilitychange", this._onVisible);
    this.watchdog = setInterval(() => this._checkAlive(), 5_000);
    this._open();
  }

  stop() {
    this.stopped = true;
    window.removeEventListener("online", this._onlineEvent);
    document.removeEventListener("visibilitychange", this._onVisible);
    clearInterval(this.watchdog);
    clearTimeout(this.retryTimer);
    this._detach(1000, "signed out");
    this._setStatus("stopped");
  }

  get online() {
    return this.status === "online";
  }

  /** Send a frame without waiting for an answer. Returns false when not online. */
  send(frame) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN || !this.welcome) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  /** Send a frame with a fresh id; resolves with its `ack`, rejects with its `error`. */
  request(type, fields = {}) {
    if (!this.online) {
      return Promise.reject(new RequestError("offline", "Not connected to the gateway."));
    }
    const id = `c${this.nextId++}`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new RequestError("timeout", "The gateway did not answer in time."));
      }, REQUEST_TIMEOUT_MS);
      this.pending.set(id, { resolve, reject, timer });
      this.send({ type, id, ...fields });
    });
  }

  /**
   * Use `token` from now on. On an open socket it goes out in a new hello at once, and the
   * promise resolves with the new `welcome` (or rejects with the gateway's error); otherwise
   * the next connect says hello with it, and a connection stopped by a refused token starts
   * again.
   */
  renew(token) {
    this.token = token;
    if (this.status === "unauthorized") {
      this.refreshed = false;
      this.start();
      return Promise.resolve(null);
    }
    if (!this.online) return Promise.resolve(null);
    return this.request("hello", { protocol: PROTOCOL, token });
  }

  /** Test hook and "reconnect now": cut the socket as a network failure would. */
  dropConnection() {
    this.stats.drops += 1;
    this._detach(1000, "client dropped the connection");
    this._scheduleReconnect(0);
  }

  reconnectNow() {
    if (this.stopped || this.status === "online" || this.status === "connecting") return;
    clearTimeout(this.retryTimer);
    this._open();
  }

  // -- internals ----------------------------------------------------------------------------

  _setStatus(status) {
    this.status = status;
    this.onStatus?.(status, { retryAt: this.retryAt, attempt: this.attempt });
  }

  _open() {
    if (this.stopped) return;
    this.retryAt = null;
    this._setStatus("connecting");
    let ws;
    try {
      ws = new WebSocket(this.url);
    } catch {
      this._scheduleReconnect();
      return;
    }
    this.ws = ws;
    this.welcome = null;
    this.authError = null;
    this.stats.sockets += 1;
    this.connectStartedAt = Date.now();
    ws.onopen = () => {
      this.lastFrameAt = Date.now();
      ws.send(JSON.stringify({ type: "hello", protocol: PROTOCOL, token: this.token }));
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
    let frame;
    try {
      frame = JSON.parse(message.data);
    } catch {
      return;
    }
    switch (frame.type) {
      case "ping":
        ws.send('{"type":"pong"}');
        return;
      case "pong":
        return;
      case "welcome": {
        const renewal = frame.ref ? this.pending.get(frame.ref) : null;
        if (renewal && this.welcome) {
          // The answer to a renewing hello: same socket, same subscriptions, new token.
          this.pending.delete(frame.ref);
          clearTimeout(renewal.timer);
          this.welcome = frame;
          this.stats.renewals += 1;
          renewal.resolve(frame);
          this.onRenewed?.(frame);
          return;
        }
        this.welcome = frame;
        this.heartbeatMs = Math.max(1_000, (frame.heartbeat_s || 20) * 1000);
        if (this.stats.connects > 0) this.stats.reconnects += 1;
        this.stats.connects += 1;
        this.attempt = 0;
        this.refreshed = false;
        this._setStatus("online");
        this.onWelcome?.(frame);
        return;
      }
      case "ack":
      case "error": {
        // Kept for the 4001 close that follows: it says why (an expired token, a bad one).
        if (frame.type === "error" && frame.code === "unauthorized") this.authError = frame.message;
        const waiter = frame.ref ? this.pending.get(frame.ref) : null;
        if (waiter) {
          this.pending.delete(frame.ref);
          clearTimeout(waiter.timer);
          if (frame.type === "ack") waiter.resolve(frame);
          else waiter.reject(new RequestError(frame.code, frame.message));
          return;
        }
        break;
      }
      default:
        break;
    }
    this.onFrame?.(frame);
  }

  _onClose(ws, event) {
    if (ws !== this.ws) return;
    this.ws = null;
    this._failPending();
    if (event.code === 4001) {
      // The token was refused, or it expired on this socket. The same token cannot do better
      // on a retry, but a new one may: ask once per refusal, so a token the gateway keeps
      // refusing (a restarted gateway that no longer issues them) does not loop.
      if (this.refreshToken && !this.refreshed) {
        this.refreshed = true;
        this._refresh();
        return;
      }
      this._refused();
      return;
    }
    this._scheduleReconnect();
  }

  _refresh() {
    const message = this.authError;
    this._setStatus("connecting");
    Promise.resolve()
      .then(() => this.refreshToken(message))
      .then(
        (token) => {
          if (this.stopped) return;
          if (!token) {
            this._refused(message);
            return;
          }
          this.token = token;
          this._open();
        },
        () => {
          // Not reachable right now: back off; the next refusal asks again.
          this.refreshed = false;
          this._scheduleReconnect();
        },
      );
  }

  _refused(message = this.authError) {
    this.stopped = true;
    clearInterval(this.watchdog);
    this._setStatus("unauthorized");
    this.onAuthFailed?.(message || "The gateway refused the token.");
  }

  /** Forget the current socket at once, without waiting for a closing handshake. */
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
      waiter.reject(new RequestError("disconnected", "The connection dropped before the gateway answered."));
      this.pending.delete(id);
    }
  }

  _scheduleReconnect(delayOverride) {
    if (this.stopped) return;
    clearTimeout(this.retryTimer);
    let delay = delayOverride;
    if (delay === undefined) {
      // Exponential backoff with "equal jitter": half fixed, half random, capped at 10 s.
      const ceiling = Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** this.attempt);
      delay = ceiling / 2 + Math.random() * (ceiling / 2);
      this.attempt += 1;
    }
    this.retryAt = Date.now() + delay;
    this._setStatus("offline");
    this.retryTimer = setTimeout(() => this._open(), delay);
  }

  _checkAlive() {
    if (this.status === "connecting" && this.ws && Date.now() - this.connectStartedAt > 12_000) {
      // Stuck opening (or waiting for welcome): give up on this socket and back off.
      this._detach(1000, "connect timeout");
      this._scheduleReconnect();
      return;
    }
    if (this.status !== "online" || !this.ws) return;
    const silence = Date.now() - this.lastFrameAt;
    // The server pings every heartbeat; we ping too, so a silent socket is a dead one.
    if (silence > Math.max(this.heartbeatMs * 2, 30_000)) {
      this.dropConnection();
    } else if (silence > Math.min(this.heartbeatMs, CLIENT_PING_MS)) {
      this.send({ type: "ping" });
    }
  }
}
