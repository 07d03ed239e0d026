// Tokens: from the URL fragment (#token=...), a pasted token, or the development endpoint.
// The token lives in sessionStorage (per tab), never in localStorage.

const TOKEN_KEY = "gw.token";
// "dev" for a token from POST /v1/dev/token, which the page can replace by itself before it
// expires; "supplied" for one the user pasted or linked, which only the user can replace.
const KIND_KEY = "gw.token.kind";

export function takeTokenFromFragment() {
  const hash = window.location.hash.replace(/^#/, "");
  if (!hash) return null;
  const params = new URLSearchParams(hash);
  const token = params.get("token");
  if (!token) return null;
  params.delete("token");
  const rest = params.toString();
  // Drop the token from the address bar and history right away.
  const url = window.location.pathname + window.location.search + (rest ? `#${rest}` : "");
  window.history.replaceState(null, "", url);
  return token.trim();
}

export function storedToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

export function storeToken(token, kind = "supplied") {
  try {
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(KIND_KEY, kind);
  } catch {
    /* storage disabled: the token only lives in memory */
  }
}

export function storedTokenKind() {
  try {
    return sessionStorage.getItem(KIND_KEY) === "dev" ? "dev" : "supplied";
  } catch {
    return "supplied";
  }
}

export function forgetToken() {
  try {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(KIND_KEY);
  } catch {
    /* ignore */
  }
}

/** The JWT's claims, decoded without verification (display only; the server verifies). */
export function decodeClaims(token) {
  try {
    const payload = token.split(".")[1];
    const b64 = payload.replace(/-/g, "+").replace(/_/g, "/");
    const json = atob(b64 + "===".slice((b64.length + 3) % 4));
    const bytes = Uint8Array.from(json, (c) => c.charCodeAt(0));
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch {
    return null;
  }
}

/** A token that is not even shaped like a JWT, or already expired by its own claims. */
export function tokenProblem(token) {
  if (!token || token.split(".").length !== 3) return "That does not look like a token (a JWT has three dot-separated parts).";
  const claims = decodeClaims(token);
  if (!claims) return "The token could not be decoded.";
  if (typeof claims.exp === "number" && claims.exp * 1000 < Date.now() - 30_000) return "This token has expired.";
  return null;
}

/**
 * Whether the gateway hands out development tokens: GET /v1/dev/token says so (always 200),
 * so loading the sign-in page leaves no failed request in the browser's console.
 */
export async function devTokensAvailable() {
  try {
    const response = await fetch("/v1/dev/token", { headers: { Accept: "application/json" }, cache: "no-store" });
    if (!response.ok) return false;
    const body = await response.json();
    return body?.available === true;
  } catch {
    return false;
  }
}

/**
 * A development token. `ttlS` is its lifetime in seconds (the gateway's default, an hour, when
 * left out). A refusal throws an Error with the HTTP `status`; a network failure throws
 * fetch's TypeError, which has none: worth retrying, unlike a refusal.
 */
export async function fetchDevToken({ user, tenant, roles, ttlS }) {
  const request = { user, tenant, roles };
  if (ttlS !== undefined && ttlS !== null) request.ttl_s = ttlS;
  const response = await fetch("/v1/dev/token", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(request),
    cache: "no-store",
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok || typeof body?.token !== "string") {
    const error = new Error(body?.error?.message || `the gateway answered ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return body.token;
}
