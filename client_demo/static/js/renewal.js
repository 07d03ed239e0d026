// The session's token. The gateway closes a socket when its token expires unless a new `hello`
// with a fresh token for the same user and tenant came first (docs/protocol.md §3). The client
// package sends that hello: for a development token it asks `fresh()` for a new one from
// POST /v1/dev/token at the time it works out, without the user noticing. A token the user
// supplied can only be replaced by the user, so they are asked for one before it expires (at
// the same time), and again once it has; `replace` hands the pasted one to the client.

import { decodeClaims, fetchDevToken, tokenProblem } from "./auth.js";
import { renewalDelay } from "./gateway-client/index.js";

// The lifetimes the development token endpoint accepts.
const MIN_TTL_S = 5;
const MAX_TTL_S = 86_400;
// Browsers wrap a timer's delay to 32 signed bits, so a longer one can fire at once: a token
// that lives longer than this is looked at again after it.
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * When a token expires and when to renew it, in local milliseconds, for a token that arrived
 * at `receivedAt`; null for a token without `exp` (which the gateway refuses anyway).
 */
export function tokenTimes(token, receivedAt = Date.now()) {
  // When to renew is the client package's rule (80 % of the lifetime, at least 3 s before exp).
  const delay = renewalDelay(token, receivedAt, receivedAt);
  if (delay === null) return null;
  const claims = decodeClaims(token);
  let expiresAt = claims.exp * 1000;
  if (typeof claims.iat === "number" && claims.exp > claims.iat) {
    // The lifetime counted from when the token arrived does not depend on this computer's
    // clock agreeing with the issuer's; the earlier of the two estimates is the safe one.
    expiresAt = Math.min(expiresAt, receivedAt + (claims.exp - claims.iat) * 1000);
  }
  return { expiresAt, renewAt: receivedAt + delay };
}

/** A new development token for the same user, tenant and roles, with the same lifetime. */
export function fetchDevTokenLike(token) {
  const claims = decodeClaims(token) || {};
  const lifetime = typeof claims.iat === "number" ? claims.exp - claims.iat : NaN;
  return fetchDevToken({
    user: claims.sub,
    tenant: claims.tenant,
    roles: Array.isArray(claims.roles) ? claims.roles : ["user"],
    ttlS: Number.isInteger(lifetime) ? Math.min(MAX_TTL_S, Math.max(MIN_TTL_S, lifetime)) : undefined,
  });
}

/**
 * state: "fresh" (nothing to do yet), "renewing" (fetching or retrying a development token),
 * "due" (a supplied token expires soon: the user is asked for a new one) or "expired" (the
 * gateway refused the token because it expired; a supplied token waits for a new one).
 */
export class TokenKeeper {
  /**
   * kind: "dev" or "supplied". apply(token): use a supplied token from now on (a renewing
   * hello on the open socket, or a reconnect; HTTP requests); may reject. onToken(token): a
   * new development token arrived (the client sends it in the hello itself). renewNow():
   * renew a development token now. onChange(): the state or the token changed.
   */
  constructor({ token, kind, apply, onToken, renewNow, onChange }) {
    this.kind = kind;
    this.apply = apply;
    this.onToken = onToken;
    this.renewNow = renewNow;
    this.onChange = onChange;
    this.timer = null;
    this.stopped = false;
    this.renewing = false;
    this.renewals = 0;
    this.failures = 0;
    this._adopt(token);
  }

  get canRenew() {
    return this.kind === "dev";
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  /** Whether a refusal of the current token was for its expiry, not for something else. */
  expiredBy(message) {
    return /expired/i.test(message || "") || (this.times !== null && Date.now() >= this.times.expiresAt);
  }

  /** The gateway refused a supplied token because it expired: the user is asked for one. */
  markExpired() {
    clearTimeout(this.timer);
    this._set("expired");
  }

  /** Why `token` cannot replace the current one, or null. */
  problemWith(token) {
    const problem = tokenProblem(token);
    if (problem) return problem;
    const next = decodeClaims(token) || {};
    if (next.sub !== this.claims.sub || next.tenant !== this.claims.tenant) {
      return `This token is for ${next.sub || "?"} in ${next.tenant || "?"}, not ${this.claims.sub} in ${this.claims.tenant}: sign out to switch users.`;
    }
    const times = tokenTimes(token);
    if (times && times.expiresAt <= Date.now()) return "This token has expired.";
    return null;
  }

  /** A token the user supplied in place of the current one. Throws when it cannot be used. */
  async replace(token) {
    const problem = this.problemWith(token);
    if (problem) throw new Error(problem);
    this._adopt(token);
    await this.apply(token);
  }

  /**
   * The client's `getToken`: a new development token, for a renewal on the open socket or a
   * reconnect whose hello was refused; null when there is none to be had (a supplied token,
   * or the endpoint refused). Throws on a network failure: the client tries again while the
   * current token holds, and backs off after that.
   */
  async fresh() {
    if (!this.canRenew || this.stopped) return null;
    this.renewing = true;
    this._set("renewing");
    let token;
    try {
      token = await fetchDevTokenLike(this.token);
    } catch (err) {
      this.renewing = false;
      if (err.status) return null;
      this.failures += 1;
      this._set(this.times && Date.now() >= this.times.expiresAt ? "expired" : "fresh");
      throw err;
    }
    this.renewing = false;
    this.renewals += 1;
    this._adopt(token);
    this.onToken?.(token);
    return token;
  }

  /** Renew a development token now (after a refusal over HTTP), instead of on schedule. */
  renewSoon() {
    if (!this.canRenew || this.stopped || this.renewing) return;
    Promise.resolve(this.renewNow?.()).catch(() => {});
  }

  // -- internals ----------------------------------------------------------------------------

  _adopt(token) {
    this.token = token;
    this.claims = decodeClaims(token) || {};
    this.times = tokenTimes(token);
    clearTimeout(this.timer);
    this.timer = null;
    this.state = "fresh";
    // A supplied token: ask the user in time. A development token: the client renews it.
    if (this.times && !this.stopped && !this.canRenew) this._schedule(this.times.renewAt);
    this.onChange?.();
  }

  _schedule(at) {
    const wait = Math.max(0, at - Date.now());
    if (wait > MAX_TIMER_MS) {
      this.timer = setTimeout(() => this._schedule(at), MAX_TIMER_MS);
      return;
    }
    this.timer = setTimeout(() => this._set("due"), wait);
  }

  _set(state) {
    if (this.state === state) return;
    this.state = state;
    this.onChange?.();
  }
}
