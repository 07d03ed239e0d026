// Keeps the session's token fresh. The gateway closes a socket when its token expires unless
// a new `hello` with a fresh token for the same user and tenant came first (docs/protocol.md
// §3). A development token is replaced with a new one from POST /v1/dev/token some time before
// it expires, without the user noticing. A token the user supplied can only be replaced by the
// user, so they are asked for one before it expires, and again once it has.

import { decodeClaims, fetchDevToken, tokenProblem } from "./auth.js";

// Renew once this share of the token's remaining lifetime has passed, and at least LEAD_MS
// before it expires: time for the round trips, and for a clock that is a little off.
const SHARE = 0.8;
const LEAD_MS = 3_000;
const RETRY_MS = 2_000;
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
  const claims = decodeClaims(token);
  if (!claims || typeof claims.exp !== "number") return null;
  let expiresAt = claims.exp * 1000;
  if (typeof claims.iat === "number" && claims.exp > claims.iat) {
    // The lifetime counted from when the token arrived does not depend on this computer's
    // clock agreeing with the issuer's; the earlier of the two estimates is the safe one.
    expiresAt = Math.min(expiresAt, receivedAt + (claims.exp - claims.iat) * 1000);
  }
  const remaining = expiresAt - receivedAt;
  const delay = Math.max(0, Math.min(remaining * SHARE, remaining - LEAD_MS));
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
   * kind: "dev" or "supplied". apply(token): use the token from now on (a renewing hello on
   * the open socket, the next connect's hello, HTTP requests); may reject. onChange(): the
   * state or the token changed.
   */
  constructor({ token, kind, apply, onChange }) {
    this.kind = kind;
    this.apply = apply;
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
   * For a reconnect whose hello was refused: a new development token, or null when there is
   * none to be had (a supplied token, or the endpoint refused). Throws on a network failure,
   * which a later attempt may get past.
   */
  async fresh() {
    if (!this.canRenew || this.stopped) return null;
    let token;
    try {
      token = await fetchDevTokenLike(this.token);
    } catch (err) {
      if (err.status) return null;
      throw err;
    }
    this._adopt(token);
    await this.apply(token);
    return token;
  }

  /** Renew a development token now (soon after a refusal), instead of on schedule. */
  renewSoon() {
    if (!this.canRenew || this.stopped || this.renewing) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this._renew(), 0);
  }

  // -- internals ----------------------------------------------------------------------------

  _adopt(token) {
    this.token = token;
    this.claims = decodeClaims(token) || {};
    this.times = tokenTimes(token);
    clearTimeout(this.timer);
    this.timer = null;
    this.state = "fresh";
    if (this.times && !this.stopped) this._schedule(this.times.renewAt);
    this.onChange?.();
  }

  _schedule(at) {
    const wait = Math.max(0, at - Date.now());
    if (wait > MAX_TIMER_MS) {
      this.timer = setTimeout(() => this._schedule(at), MAX_TIMER_MS);
      return;
    }
    this.timer = setTimeout(() => (this.canRenew ? this._renew() : this._set("due")), wait);
  }

  async _renew() {
    if (this.stopped || this.renewing) return;
    this.renewing = true;
    this._set("renewing");
    let token;
    try {
      token = await fetchDevTokenLike(this.token);
    } catch {
      this.renewing = false;
      this.failures += 1;
      if (this.stopped) return;
      // Until the current token expires it still holds: try again. After that the gateway
      // closes the socket, and the reconnect asks for a token itself (`fresh`).
      const left = this.times ? this.times.expiresAt - Date.now() : 0;
      if (left > 0) this.timer = setTimeout(() => this._renew(), Math.max(200, Math.min(RETRY_MS, left / 2)));
      else this._set("expired");
      return;
    }
    this.renewing = false;
    if (this.stopped) return;
    this.renewals += 1;
    // Adopted before the hello is answered: whatever happens to this socket, the next one
    // says hello with the new token.
    this._adopt(token);
    try {
      await this.apply(token);
    } catch {
      /* the socket dropped, or the hello was refused and the socket closes: a reconnect follows */
    }
  }

  _set(state) {
    if (this.state === state) return;
    this.state = state;
    this.onChange?.();
  }
}
