// When to renew a token, worked out from its own claims (decoded, never verified: only the
// gateway can verify). docs/protocol.md §3 "Token expiry and a new hello": the gateway closes
// a connection with 4001 once its token's `exp` (plus leeway) passes, unless a new `hello`
// with a fresh token arrived on the open socket first.

/**
 * The token's claims, or null when it is not a readable JWT.
 * @param {string} token
 * @returns {{exp?: number, iat?: number, sub?: string, tenant?: string, roles?: string[]} | null}
 */
export function decodeClaims(token) {
  const part = typeof token === "string" ? token.split(".")[1] : undefined;
  if (!part) return null;
  try {
    const base64 = part.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(part.length / 4) * 4, "=");
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    const claims = JSON.parse(new TextDecoder().decode(bytes));
    return claims && typeof claims === "object" ? claims : null;
  } catch {
    return null;
  }
}

/**
 * Milliseconds from `receivedAt` until the token should be renewed: once 80 % of its remaining
 * lifetime has passed, and at least 3 s before `exp`. The lifetime is also counted as
 * `exp - iat` from when the token arrived, so a local clock running late does not make the
 * renewal late. Null when the token carries no `exp` (nothing to renew).
 * @param {string} token
 * @param {number} [receivedAt] Date.now() when the token arrived
 * @param {number} [now]
 * @returns {number | null}
 */
export function renewalDelay(token, receivedAt = Date.now(), now = Date.now()) {
  const claims = decodeClaims(token);
  if (!claims || typeof claims.exp !== "number") return null;
  let lifetime = claims.exp * 1000 - receivedAt;
  if (typeof claims.iat === "number" && claims.exp > claims.iat) {
    lifetime = Math.min(lifetime, (claims.exp - claims.iat) * 1000);
  }
  const due = receivedAt + Math.min(lifetime * 0.8, lifetime - 3_000);
  return Math.max(0, due - now);
}

/**
 * Milliseconds until the token expires (negative once it has), or null without `exp`.
 * @param {string} token
 * @param {number} [now]
 * @returns {number | null}
 */
export function expiresIn(token, now = Date.now()) {
  const claims = decodeClaims(token);
  return claims && typeof claims.exp === "number" ? claims.exp * 1000 - now : null;
}
