// The browser chat client: sign-in, threads, streaming chat, inline approvals, reviewer inbox.
// The connection (reconnects, resuming from cursors, token renewal on the open socket) and
// each thread's state come from the client package (client_demo/js, served to this page as
// js/gateway-client/); this file is the page around it. Plain ES modules, no build step.

import { Api } from "./api.js";
import {
  decodeClaims,
  devTokensAvailable,
  fetchDevToken,
  forgetToken,
  storedToken,
  storedTokenKind,
  storeToken,
  takeTokenFromFragment,
  tokenProblem,
} from "./auth.js";
import { $, clear, h, relativeTime, setText } from "./dom.js";
import { GatewayClient, mayDecide, webStorageStore } from "./gateway-client/index.js";
import { Inbox, InboxView } from "./inbox.js";
import { TokenKeeper, fetchDevTokenLike } from "./renewal.js";
import { ChatView, renderStatusBadge } from "./view.js";

const MAX_OPEN_THREADS = 8;
// A thread's address in the page: #/t/<thread_id>, so a conversation can be linked and reopened.
const THREAD_LINK = /^#\/t\/([A-Za-z0-9_.:-]{1,64})$/;
const SUGGESTIONS = [
  "refund order 42 for 30 dollars",
  "what is the status of orders 3 and 8?",
  "tell me a story",
  "email ann@example.com about order 7",
];

// -- elements ---------------------------------------------------------------------------------

const el = {
  signin: $("#signin"),
  devForm: $("#dev-form"),
  devError: $("#dev-error"),
  tokenForm: $("#token-form"),
  tokenError: $("#token-error"),
  signinNote: $("#signin-note"),
  divider: $("#signin-divider"),
  app: $("#app"),
  sidebar: $("#sidebar"),
  scrim: $("#scrim"),
  menu: $("#menu"),
  menuCount: $("#menu-count"),
  newChat: $("#new-chat"),
  threadList: $("#thread-list"),
  threadsEmpty: $("#threads-empty"),
  showArchived: $("#show-archived"),
  threadsTitle: $("#threads-title"),
  inbox: $("#inbox"),
  me: $("#me"),
  meName: $("#me-name"),
  meDetail: $("#me-detail"),
  signOut: $("#sign-out"),
  title: $("#chat-title"),
  sub: $("#chat-sub"),
  badge: $("#status-badge"),
  cancel: $("#cancel-run"),
  regenerate: $("#regenerate"),
  retry: $("#retry"),
  threadActions: $("#thread-actions"),
  threadMenu: $("#thread-menu"),
  renameThread: $("#rename-thread"),
  archiveThread: $("#archive-thread"),
  deleteThread: $("#delete-thread"),
  conn: $("#conn"),
  connLabel: $("#conn-label"),
  log: $("#log"),
  empty: $("#empty-chat"),
  suggestions: $("#suggestions"),
  emptyStart: $("#empty-start"),
  emptyFollow: $("#empty-follow"),
  items: $("#items"),
  outbox: $("#outbox"),
  composer: $("#composer"),
  input: $("#input"),
  send: $("#send"),
  composerNote: $("#composer-note"),
  composerHint: $("#composer-hint"),
  toast: $("#toast"),
  renewal: $("#renewal"),
  renewalTitle: $("#renewal-title"),
  renewalDetail: $("#renewal-detail"),
  renewalForm: $("#renewal-form"),
  renewalError: $("#renewal-error"),
};

// -- state ------------------------------------------------------------------------------------

const app = {
  token: null,
  claims: null,
  me: null, // the `welcome` frame
  client: null, // GatewayClient: the connection, and each thread's state and cursor
  api: null,
  keeper: null, // TokenKeeper: supplies development tokens, or asks the user for a new one
  scope: null,
  open: [], // subscribed thread ids, most recently used last
  current: null, // the thread shown, or null for a new chat
  threads: [], // the live thread list (threads.subscribe), the most recently active first
  threadsVersion: 0,
  archivedView: false, // the list shows the archived threads
  outbox: [], // local messages not yet acknowledged: {id, threadId, text, status, error}
  inbox: new Inbox(),
  inboxWanted: false,
  scrollToApproval: null,
  cancelling: false,
  timers: [],
};

let outboxIds = 1;
const chat = new ChatView(el.items, {
  decide: (approvalId, decision, reason, edited) => decide(approvalId, decision, reason, edited),
  // The run's own user decides the calls its tool leaves to them (docs/protocol.md §3).
  canDecide: (approval) =>
    mayDecide(approval, { user: userName(), roles: roles(), owner: threadMeta(app.current)?.owner || null }),
});
const inboxView = new InboxView(el.inbox, {
  onOpen: (approval) => openThread(approval.thread_id, { approvalId: approval.approval_id }),
  titleOf: (threadId) => titleOf(threadId),
});

// -- roles ------------------------------------------------------------------------------------

function roles() {
  return app.me?.roles || app.claims?.roles || [];
}

function hasRole(...wanted) {
  const have = roles();
  return wanted.some((role) => have.includes(role));
}

function userName() {
  return app.me?.user || app.claims?.sub || "";
}

function threadMeta(threadId) {
  return app.threads.find((t) => t.thread_id === threadId) || null;
}

function canCompose(threadId) {
  if (hasRole("admin")) return true;
  if (!hasRole("user")) return false;
  if (!threadId) return true;
  const meta = threadMeta(threadId);
  return !meta || meta.owner === userName();
}

// -- sign-in ----------------------------------------------------------------------------------

async function boot() {
  const fromFragment = takeTokenFromFragment();
  if (fromFragment) storeToken(fromFragment, "supplied");
  const token = fromFragment || storedToken();
  const kind = fromFragment ? "supplied" : storedTokenKind();
  if (token && !tokenProblem(token)) {
    startSession(token, kind);
    return;
  }
  if (token && kind === "dev" && decodeClaims(token)) {
    // A development token that expired while the page was away: the gateway hands out
    // another for the same user, and the session (cursors, open threads) carries on.
    try {
      const fresh = await fetchDevTokenLike(token);
      storeToken(fresh, "dev");
      startSession(fresh, "dev");
      return;
    } catch {
      /* no longer in development mode, or unreachable: sign in again */
    }
  }
  if (token) forgetToken();
  await showSignin(token ? tokenProblem(token) : null);
}

async function showSignin(message) {
  el.app.hidden = true;
  el.signin.hidden = false;
  document.title = "Sign in · Agents Gateway";
  setText(el.tokenError, message || "");
  el.tokenError.hidden = !message;
  const dev = await devTokensAvailable();
  el.devForm.hidden = !dev;
  el.divider.hidden = !dev;
  el.signin.dataset.mode = dev ? "development" : "token";
  setText(
    el.signinNote,
    dev
      ? "Development mode: the gateway issues tokens to anyone on this machine."
      : "Paste an access token issued for this gateway, or open this page with #token=… in the address.",
  );
  (dev ? el.devForm.querySelector("input[name=user]") : el.tokenForm.querySelector("textarea")).focus();
}

el.devForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = new FormData(el.devForm);
  const user = String(form.get("user") || "").trim();
  const tenant = String(form.get("tenant") || "").trim() || "demo";
  const chosen = form.getAll("roles").map(String);
  const ttl = String(form.get("ttl_s") || "").trim();
  el.devError.hidden = true;
  if (!user) return;
  if (!chosen.length) {
    setText(el.devError, "Pick at least one role.");
    el.devError.hidden = false;
    return;
  }
  const button = el.devForm.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const token = await fetchDevToken({ user, tenant, roles: chosen, ttlS: ttl ? Number(ttl) : undefined });
    storeToken(token, "dev");
    startSession(token, "dev");
  } catch (err) {
    setText(el.devError, `Could not get a token: ${err.message}`);
    el.devError.hidden = false;
  } finally {
    button.disabled = false;
  }
});

el.tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const token = String(new FormData(el.tokenForm).get("token") || "").trim();
  const problem = tokenProblem(token);
  if (problem) {
    setText(el.tokenError, problem);
    el.tokenError.hidden = false;
    return;
  }
  storeToken(token, "supplied");
  startSession(token, "supplied");
});

function startSession(token, kind) {
  app.token = token;
  app.claims = decodeClaims(token) || {};
  app.scope = `${app.claims.tenant || "?"}/${app.claims.sub || "?"}`;
  app.api = new Api(token);
  const ui = loadUi();
  app.open = ui.open;
  // A link to a thread (#/t/<id>) wins over the thread this tab showed last.
  app.current = linkedThread() ?? ui.current;
  if (app.current && !app.open.includes(app.current)) app.open.push(app.current);
  el.signin.hidden = true;
  el.app.hidden = false;
  el.tokenForm.reset();
  renderMe();
  app.keeper = new TokenKeeper({
    token,
    kind,
    apply: useToken,
    onToken: rememberToken,
    renewNow: () => app.client?.connection.renew(),
    onChange: renderRenewal,
  });
  const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
  const client = new GatewayClient({
    url: `${scheme}//${window.location.host}/v1/ws`,
    token,
    // Development tokens are renewed by the client, from POST /v1/dev/token; a supplied token
    // only by the user (TokenKeeper asks them), so the client gets no way to renew one.
    getToken: kind === "dev" ? () => app.keeper?.fresh() ?? null : undefined,
    // One value per thread in this tab: its state and cursor together, kept across reloads.
    store: webStorageStore(sessionStorage, `gw.thread.${app.scope}.`),
  });
  app.client = client;
  client.on("status", renderConnection);
  client.on("welcome", onWelcome);
  client.on("renewed", onRenewed);
  client.on("unauthorized", (message) => tokenRefused(message));
  client.on("thread", onThread);
  client.on("reset", (threadId) => threadId === app.current && chat.reset(threadId));
  client.on("inbox", onInbox);
  client.on("threads", onThreads);
  client.on("error", (frame) => {
    if (frame.code === "unauthorized") return;
    if (frame.thread_id && (frame.code === "not_found" || frame.code === "forbidden")) {
      // A thread this tab had open, or a link named, that is gone or not this user's.
      closeThread(frame.thread_id);
      toast(`Cannot open that conversation: ${frame.message}`);
      return;
    }
    toast(frame.message || frame.code);
  });
  // The threads open in this tab before a reload: subscribed again from their stored cursors.
  for (const threadId of app.open) subscribe(threadId);
  client.connect();
  // The list follows every change as it happens (threads.subscribe), across reconnects.
  client.subscribeThreads({ archived: app.archivedView }).catch((err) => toast(`Conversations unavailable: ${err.message}`));
  showLink(app.current);
  app.timers.push(
    setInterval(() => {
      renderConnection(app.client?.status);
      renderRenewal();
    }, 1000),
  );
  render({ full: true });
  el.input.focus();
}

function online() {
  return Boolean(app.client?.connection.online);
}

function signOut(message) {
  app.client?.close();
  app.client = null;
  app.keeper?.stop();
  app.keeper = null;
  renderRenewal();
  for (const timer of app.timers) clearInterval(timer);
  app.timers = [];
  try {
    // Forget everything this tab kept for the session: token, cursors, snapshots, UI.
    const keys = [];
    for (let i = 0; i < sessionStorage.length; i += 1) keys.push(sessionStorage.key(i));
    for (const key of keys) if (key?.startsWith("gw.")) sessionStorage.removeItem(key);
  } catch {
    /* ignore */
  }
  forgetToken();
  Object.assign(app, {
    token: null,
    claims: null,
    me: null,
    open: [],
    inboxWanted: false,
    current: null,
    archivedView: false,
    threads: [],
    outbox: [],
  });
  app.inbox.reset();
  chat.reset(null);
  showSignin(message);
}

el.signOut.addEventListener("click", () => signOut());

// -- token renewal ----------------------------------------------------------------------------

/** From now on, `token` is the session's: HTTP requests and a reload use it. */
function rememberToken(token) {
  app.token = token;
  app.claims = decodeClaims(token) || app.claims;
  if (app.api) app.api.token = token;
  storeToken(token, app.keeper?.kind ?? "supplied");
}

/** A token the user supplied: the client sends it in a new hello (or reconnects with it). */
function useToken(token) {
  rememberToken(token);
  return app.client ? app.client.connection.renew(token) : Promise.resolve(null);
}

/** The gateway refused the token: a 4001 close, or (`http`) a 401 answer. */
function tokenRefused(message, { http = false } = {}) {
  const keeper = app.keeper;
  if (keeper?.canRenew && http) {
    // The socket asks for a new development token itself when the gateway refuses the
    // current one there; a 401 over HTTP only hurries the renewal along.
    keeper.renewSoon();
    return;
  }
  if (keeper && !keeper.canRenew && keeper.expiredBy(message)) {
    // Nothing else is wrong: a token the user pastes resumes the session where it was, so
    // keep every thread, cursor and draft.
    keeper.markExpired();
    renderConnection(app.client?.status);
    return;
  }
  signOut(`The gateway refused your token: ${message}`);
}

function onRenewed(welcome) {
  const before = roles().join(",");
  const hadInbox = hasRole("reviewer", "admin");
  app.me = welcome;
  renderMe();
  if (!hadInbox) subscribeInbox();
  renderConnection(app.client?.status);
  // New roles change what the page offers (approval buttons, the inbox, the composer); with
  // the same roles there is nothing to draw again.
  if (roles().join(",") !== before) render({ full: true });
}

function renderRenewal() {
  const keeper = app.keeper;
  const state = keeper && !keeper.canRenew ? keeper.state : "fresh";
  const shown = state === "due" || state === "expired";
  el.renewal.dataset.state = state;
  if (!shown) {
    el.renewal.hidden = true;
    return;
  }
  const left = keeper.times ? keeper.times.expiresAt - Date.now() : 0;
  const closed = state === "expired";
  setText(el.renewalTitle, closed || left <= 0 ? "Your access token has expired." : "Your access token expires soon.");
  setText(
    el.renewalDetail,
    closed
      ? "The gateway closed the connection. Paste a new token to reconnect: your conversations carry on where they were."
      : left > 0
        ? `It expires in ${countdown(left)}. Paste a new token for ${keeper.claims.sub} to stay connected.`
        : "Paste a new token to stay connected.",
  );
  if (el.renewal.hidden) {
    el.renewal.hidden = false;
    el.renewalError.hidden = true;
  }
}

function countdown(ms) {
  const seconds = Math.max(0, Math.ceil(ms / 1000));
  const minutes = Math.floor(seconds / 60);
  return minutes ? `${minutes} min ${String(seconds % 60).padStart(2, "0")} s` : `${seconds} s`;
}

el.renewalForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = String(new FormData(el.renewalForm).get("token") || "").trim();
  if (!token || !app.keeper) return;
  el.renewalError.hidden = true;
  const button = el.renewalForm.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    await app.keeper.replace(token);
    el.renewalForm.reset();
    toast("Using the new token.");
  } catch (err) {
    setText(el.renewalError, err.message);
    el.renewalError.hidden = false;
  } finally {
    button.disabled = false;
    renderRenewal();
  }
});

// -- session UI state (sessionStorage) ---------------------------------------------------------

function uiKey() {
  return `gw.ui.${app.scope}`;
}

function loadUi() {
  try {
    const ui = JSON.parse(sessionStorage.getItem(uiKey()) || "{}");
    return { open: Array.isArray(ui.open) ? ui.open : [], current: ui.current || null };
  } catch {
    return { open: [], current: null };
  }
}

function saveUi() {
  try {
    sessionStorage.setItem(uiKey(), JSON.stringify({ open: app.open, current: app.current }));
  } catch {
    /* ignore */
  }
}

function titleOf(threadId) {
  if (!threadId) return "New chat";
  // The gateway's title (the first input unless renamed), as the live list has it.
  const title = threadMeta(threadId)?.title || loadedState(threadId)?.title;
  return title || `Conversation ${threadId.slice(2, 8)}`;
}

// -- connection -------------------------------------------------------------------------------

function onWelcome(welcome) {
  // The client resubscribes every watched thread from its cursor by itself.
  app.me = welcome;
  renderMe();
  subscribeInbox();
  flushOutbox();
  render({ full: true });
}

function subscribeInbox() {
  if (app.inboxWanted || !hasRole("reviewer", "admin") || !app.client) return;
  app.inboxWanted = true;
  app.client.subscribeInbox().catch((err) => toast(`Inbox unavailable: ${err.message}`));
}

function subscribe(threadId) {
  app.client.subscribe(threadId).catch((err) => {
    if (err.code === "not_found" || err.code === "forbidden") {
      closeThread(threadId);
      toast(`Cannot open that conversation: ${err.message}`);
    }
  });
}

/** A thread's state: its stored one, or an empty one. */
function getState(threadId) {
  return app.client.thread(threadId);
}

/** A thread's state only when this page has it already (the thread list does not load any). */
function loadedState(threadId) {
  return app.client?.threads.get(threadId)?.state ?? null;
}

function onThread(state) {
  const threadId = state.threadId;
  if (state.status !== lastStatus.get(threadId)) {
    lastStatus.set(threadId, state.status);
    app.threadsVersion += 1;
  }
  scheduleRender();
}
const lastStatus = new Map();

function onInbox(approvals) {
  app.inbox.replace(approvals);
  scheduleRender();
}

function onThreads(threads) {
  app.threads = threads;
  app.threadsVersion += 1;
  scheduleRender();
}

// -- threads ----------------------------------------------------------------------------------

function openThread(threadId, { approvalId = null } = {}) {
  closeDrawer();
  app.scrollToApproval = approvalId ? { id: approvalId, until: Date.now() + 15_000 } : null;
  if (app.current !== threadId) {
    app.current = threadId;
    chat.reset(threadId);
    stickToBottom = true;
  }
  const watched = app.open.includes(threadId);
  app.open = app.open.filter((id) => id !== threadId);
  app.open.push(threadId);
  while (app.open.length > MAX_OPEN_THREADS) {
    app.client.unsubscribe(app.open.shift()).catch(() => {});
  }
  if (!watched) subscribe(threadId);
  saveUi();
  showLink(threadId);
  render({ full: true });
  if (!approvalId) el.input.focus({ preventScroll: true });
}

/** The thread the address names (#/t/<id>), if any. */
function linkedThread() {
  const match = THREAD_LINK.exec(window.location.hash);
  return match ? match[1] : null;
}

/**
 * Put the shown thread in the address, or take it out: a new entry in the history, or with
 * `replace` the current one (a new chat that has just become its thread).
 */
function showLink(threadId, { replace = false } = {}) {
  if (linkedThread() === threadId) return;
  const url = window.location.pathname + window.location.search + (threadId ? `#/t/${threadId}` : "");
  if (replace) window.history.replaceState(null, "", url);
  else window.history.pushState(null, "", url);
}

// Back, forward, or an edited address: show what it names.
window.addEventListener("popstate", () => {
  if (!app.token) return;
  const threadId = linkedThread();
  if (threadId === app.current) return;
  if (threadId) openThread(threadId);
  else newChat();
});

function closeThread(threadId) {
  app.open = app.open.filter((id) => id !== threadId);
  if (app.current === threadId) {
    app.current = null;
    showLink(null);
  }
  app.client?.forget(threadId);
  saveUi();
  render({ full: true });
}

function newChat() {
  closeDrawer();
  app.current = null;
  app.scrollToApproval = null;
  chat.reset(null);
  saveUi();
  showLink(null);
  render({ full: true });
  el.input.focus();
}

el.newChat.addEventListener("click", newChat);

// -- renaming, archiving, deleting --------------------------------------------------------------

function closeThreadMenu() {
  el.threadMenu.hidden = true;
  el.threadActions.setAttribute("aria-expanded", "false");
}

el.threadActions.addEventListener("click", () => {
  const open = el.threadMenu.hidden;
  el.threadMenu.hidden = !open;
  el.threadActions.setAttribute("aria-expanded", String(open));
  if (open) el.renameThread.focus();
});

document.addEventListener("click", (event) => {
  if (!el.threadMenu.hidden && !event.target.closest("#thread-menu, #thread-actions")) closeThreadMenu();
});

el.renameThread.addEventListener("click", async () => {
  closeThreadMenu();
  const threadId = app.current;
  if (!threadId) return;
  const title = window.prompt("Rename this conversation", titleOf(threadId));
  if (title === null || !title.trim() || title.trim() === titleOf(threadId)) return;
  try {
    await app.client.renameThread(threadId, title);
  } catch (err) {
    toast(`Could not rename: ${err.message}`);
  }
  render();
});

el.archiveThread.addEventListener("click", async () => {
  closeThreadMenu();
  const threadId = app.current;
  if (!threadId) return;
  const archived = Boolean(threadMeta(threadId)?.archived);
  try {
    await app.client.archiveThread(threadId, !archived);
    toast(archived ? "Moved back to your conversations." : "Archived. Find it under Archived.");
    // Out of the list it was opened from, as a mail client's archive does.
    if (!archived && !app.archivedView) newChat();
  } catch (err) {
    toast(`Could not ${archived ? "unarchive" : "archive"}: ${err.message}`);
  }
  render({ full: true });
});

el.deleteThread.addEventListener("click", async () => {
  closeThreadMenu();
  const threadId = app.current;
  if (!threadId) return;
  if (!window.confirm(`Delete “${titleOf(threadId)}”? The conversation cannot be brought back.`)) return;
  try {
    await app.client.deleteThread(threadId);
    closeThread(threadId);
    toast("Conversation deleted.");
  } catch (err) {
    toast(
      err.code === "conflict"
        ? "Stop the answer (or decide its approval) before deleting the conversation."
        : `Could not delete: ${err.message}`,
    );
  }
});

el.showArchived.addEventListener("click", () => {
  app.archivedView = !app.archivedView;
  app.threads = [];
  app.threadsVersion += 1;
  app.client?.subscribeThreads({ archived: app.archivedView }).catch((err) => toast(err.message));
  render();
});

// -- sending ----------------------------------------------------------------------------------

function submitComposer() {
  const text = el.input.value;
  if (!text.trim() || !canCompose(app.current)) return;
  el.input.value = "";
  autosize();
  const item = { id: outboxIds++, threadId: app.current, text, status: "waiting", error: null };
  app.outbox.push(item);
  stickToBottom = true;
  sendOutboxItem(item);
  render();
}

function sendOutboxItem(item) {
  if (!online()) {
    item.status = "waiting";
    return;
  }
  item.status = "sending";
  item.error = null;
  const request = item.threadId
    ? app.client.sendInput(item.threadId, item.text)
    : app.client.startRun({ input: item.text });
  request
    .then((ack) => {
      removeOutbox(item);
      if (!item.threadId && ack.threadId) {
        // The gateway subscribed this connection to the new thread already.
        const threadId = ack.threadId;
        app.open = app.open.filter((id) => id !== threadId).concat(threadId);
        if (app.current === null) {
          app.current = threadId;
          chat.reset(threadId);
          showLink(threadId, { replace: true });
        }
        saveUi();
      }
      render();
    })
    .catch((err) => {
      item.status = "error";
      item.error =
        err.code === "disconnected"
          ? "The connection dropped before the gateway confirmed this message; it may or may not have arrived."
          : err.message;
      render();
    });
}

function removeOutbox(item) {
  app.outbox = app.outbox.filter((other) => other !== item);
}

function flushOutbox() {
  for (const item of app.outbox) if (item.status === "waiting") sendOutboxItem(item);
}

el.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  submitComposer();
});

el.input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    submitComposer();
  }
});

function autosize() {
  el.input.style.height = "auto";
  el.input.style.height = `${Math.min(el.input.scrollHeight, 200)}px`;
}
el.input.addEventListener("input", autosize);

el.cancel.addEventListener("click", () => {
  const state = app.current ? loadedState(app.current) : null;
  const runId = state?.activeRunId;
  if (!runId || app.cancelling) return;
  app.cancelling = true;
  render();
  // Stops the run; the connection and the thread stay.
  app.client
    .cancel(runId)
    .catch((err) => toast(`Could not stop: ${err.message}`))
    .finally(() => {
      app.cancelling = false;
      render();
    });
});

el.regenerate.addEventListener("click", () => {
  const threadId = app.current;
  if (!threadId || app.regenerating) return;
  app.regenerating = true;
  render();
  // A new answer to the last message; the current one stays, shown as an earlier version.
  app.client
    .regenerate(threadId)
    .catch((err) => toast(`Could not regenerate: ${err.message}`))
    .finally(() => {
      app.regenerating = false;
      render();
    });
});

el.retry.addEventListener("click", () => {
  const state = app.current ? getState(app.current) : null;
  const runId = state?.runId;
  if (!runId || app.retrying) return;
  app.retrying = true;
  render();
  // The failed answer goes on from its last checkpoint in a new run; both stay in the thread.
  app.client
    .retry(runId)
    .catch((err) => toast(`Could not try again: ${err.message}`))
    .finally(() => {
      app.retrying = false;
      render();
    });
});

async function decide(approvalId, decision, reason, edited) {
  if (!online()) throw new Error("Not connected; try again when the indicator shows online.");
  try {
    await app.client.decide(approvalId, decision, reason || undefined, edited === undefined ? {} : { arguments: edited });
  } catch (err) {
    throw new Error(err.code === "conflict" ? `Already settled: ${err.message}` : err.message);
  }
}

// -- rendering --------------------------------------------------------------------------------

let renderQueued = false;
let stickToBottom = true;
let renderedThreadsVersion = -1;

function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  const run = () => {
    if (!renderQueued) return;
    renderQueued = false;
    render();
  };
  requestAnimationFrame(run);
  setTimeout(run, 100); // rAF does not fire in background tabs
}

el.log.addEventListener("scroll", () => {
  stickToBottom = el.log.scrollHeight - el.log.scrollTop - el.log.clientHeight < 80;
});

function render({ full = false } = {}) {
  if (!app.token) return;
  const state = app.current ? getState(app.current) : null;
  // A reviewer learns that approvals wait wherever the inbox is out of sight: in the tab's
  // title, and on the phone's menu button, behind which the inbox sits.
  const waiting = hasRole("reviewer", "admin") ? app.inbox.approvals.size : 0;
  const waitingNote = waiting === 1 ? "1 approval waiting" : `${waiting} approvals waiting`;
  document.title = `${waiting ? `(${waiting}) ` : ""}${app.current ? titleOf(app.current) : "New chat"} · Agents Gateway`;
  setText(el.menuCount, String(waiting));
  el.menuCount.hidden = waiting === 0;
  el.menu.setAttribute("aria-label", waiting ? `Show conversations (${waitingNote})` : "Show conversations");
  el.app.dataset.thread = app.current || "";

  // Header
  setText(el.title, titleOf(app.current));
  el.title.title = app.current ? titleOf(app.current) : "";
  const meta = app.current ? threadMeta(app.current) : null;
  const subParts = [];
  if (meta && meta.owner !== userName()) subParts.push(`owned by ${meta.owner}`);
  const lastRun = state?.runId ? state.runs[state.runId] : null;
  if (state && state.seq < state.headSeq) subParts.push(`catching up… ${state.seq}/${state.headSeq}`);
  else if (lastRun?.agent) subParts.push(`agent: ${lastRun.agent}`);
  setText(el.sub, subParts.join(" · "));
  renderStatusBadge(el.badge, state);
  const activeRun = state?.activeRunId;
  el.cancel.hidden = !(activeRun && canCompose(app.current));
  el.cancel.disabled = app.cancelling || !online();
  setText(el.cancel, app.cancelling ? "Stopping…" : "Stop");
  el.regenerate.hidden = !(state?.runId && !activeRun && canCompose(app.current));
  // A failed answer can go on from where it stopped (§4 run.retry), once.
  el.retry.hidden = !(lastRun?.status === "failed" && !lastRun.retriedBy && !activeRun && canCompose(app.current));
  el.retry.disabled = Boolean(app.retrying) || !online();
  // Renaming, archiving and deleting: the owner's or an admin's, as for sending.
  el.threadActions.hidden = !(app.current && canCompose(app.current));
  if (el.threadActions.hidden) closeThreadMenu();
  setText(el.archiveThread, threadMeta(app.current)?.archived ? "Unarchive" : "Archive");
  el.regenerate.disabled = Boolean(app.regenerating) || !online();

  // Conversation
  if (full) chat.invalidateApprovals();
  chat.render(state);
  // Screen readers wait for a streaming answer to finish instead of reading every delta.
  const streaming = Boolean(state?.items.some((item) => item.kind === "message" && item.status === "streaming"));
  el.items.setAttribute("aria-busy", String(streaming));
  renderOutbox();
  const pendingHere = app.outbox.some((item) => item.threadId === app.current);
  el.empty.hidden = Boolean(state && (state.items.length || state.seq > 0)) || pendingHere;
  renderSuggestions();
  // Roles that cannot start runs (a reviewer, a viewer) get no ways to start one that would
  // only fail: no suggestions, no "New chat".
  const mayStart = hasRole("user", "admin");
  el.emptyStart.hidden = !mayStart;
  el.emptyFollow.hidden = mayStart;
  el.newChat.hidden = !mayStart;

  // Composer
  const allowed = canCompose(app.current);
  el.composer.hidden = !allowed;
  el.composerNote.hidden = allowed;
  setText(
    el.composerNote,
    hasRole("user", "admin")
      ? "Only the owner of this conversation can send messages here."
      : `You are signed in as ${roles().join(", ") || "a guest"}: you can follow conversations${hasRole("reviewer") ? " and decide approvals" : ""}, not start them.`,
  );
  const status = state?.status;
  let hint = "Enter to send · Shift+Enter for a new line";
  let placeholder = "Message the assistant…";
  if (status === "waiting_for_review") {
    placeholder = "Add a message…";
    hint = "The assistant reads it as soon as the approval is decided.";
  } else if (activeRun) {
    placeholder = "Write a follow-up message…";
    hint = "It is answered once the current answer is finished.";
  }
  el.input.placeholder = placeholder;
  setText(el.composerHint, hint);

  // Sidebar
  if (full || renderedThreadsVersion !== app.threadsVersion) renderThreads();
  el.inbox.hidden = !hasRole("reviewer", "admin");
  inboxView.render(app.inbox, { force: full });

  if (stickToBottom) el.log.scrollTop = el.log.scrollHeight;
  maybeScrollToApproval();
}

function renderOutbox() {
  clear(el.outbox);
  for (const item of app.outbox) {
    if (item.threadId !== app.current) continue;
    const label = {
      waiting: "Waiting for the connection…",
      sending: "Sending…",
      error: item.error || "Not sent",
    }[item.status];
    const li = h(
      "li",
      { class: `msg msg-user pending status-${item.status}`, dataset: { testid: "pending-message", status: item.status } },
      h("div", { class: "bubble" }, h("div", { class: "bubble-text" }, item.text)),
      h("div", { class: "input-state" }, label),
    );
    if (item.status === "error") {
      li.append(
        h(
          "div",
          { class: "pending-actions" },
          h("button", { type: "button", class: "btn btn-small", onclick: () => { sendOutboxItem(item); render(); } }, "Send again"),
          h("button", { type: "button", class: "btn btn-small btn-ghost", onclick: () => { removeOutbox(item); render(); } }, "Dismiss"),
        ),
      );
    }
    el.outbox.append(li);
  }
}

let suggestionsRendered = false;
function renderSuggestions() {
  if (suggestionsRendered) return;
  suggestionsRendered = true;
  for (const text of SUGGESTIONS) {
    el.suggestions.append(
      h(
        "button",
        {
          type: "button",
          class: "suggestion",
          onclick: () => {
            el.input.value = text;
            autosize();
            el.input.focus();
          },
        },
        text,
      ),
    );
  }
}

function renderThreads() {
  renderedThreadsVersion = app.threadsVersion;
  clear(el.threadList);
  const known = new Set(app.threads.map((t) => t.thread_id));
  const rows = [...app.threads];
  // A thread opened from the inbox may not be in the first page of the list yet.
  if (app.current && !known.has(app.current) && !app.archivedView) rows.unshift({ thread_id: app.current, owner: "", created_at: "" });
  el.threadsEmpty.hidden = rows.length > 0;
  setText(el.threadsEmpty, app.archivedView ? "No archived conversations." : "No conversations yet.");
  setText(el.threadsTitle, app.archivedView ? "Archived" : "Conversations");
  setText(el.showArchived, app.archivedView ? "Back" : "Archived");
  el.showArchived.setAttribute("aria-pressed", String(app.archivedView));
  for (const thread of rows) {
    const state = loadedState(thread.thread_id);
    // The live list's status; a thread this page watches knows its own sooner.
    const status = state && state.seq > 0 ? state.status : thread.status || null;
    const owner = thread.owner && thread.owner !== userName() ? thread.owner : null;
    const when = thread.last_activity_at || thread.created_at;
    const waiting = thread.pending_approvals || 0;
    const sub = [owner, when ? relativeTime(when) : ""].filter(Boolean).join(" · ");
    const button = h(
      "button",
      {
        type: "button",
        class: "thread-item",
        "aria-current": thread.thread_id === app.current ? "page" : null,
        dataset: { testid: "thread-item", threadId: thread.thread_id },
        onclick: () => openThread(thread.thread_id),
      },
      h("span", { class: "thread-title" }, titleOf(thread.thread_id)),
      h(
        "span",
        { class: "thread-sub" },
        status ? h("span", { class: `dot status-${status}`, title: status }) : null,
        sub,
        waiting
          ? h(
              "span",
              { class: "thread-waiting", dataset: { testid: "thread-waiting" } },
              waiting === 1 ? "1 approval waiting" : `${waiting} approvals waiting`,
            )
          : null,
      ),
    );
    el.threadList.append(h("li", {}, button));
  }
}

function maybeScrollToApproval() {
  const target = app.scrollToApproval;
  if (!target) return;
  if (Date.now() > target.until) {
    app.scrollToApproval = null;
    return;
  }
  const card = el.items.querySelector(`[data-approval-id="${CSS.escape(target.id)}"]`);
  if (!card) return;
  app.scrollToApproval = null;
  stickToBottom = false;
  card.scrollIntoView({ block: "center", behavior: "smooth" });
  card.classList.add("flash");
  setTimeout(() => card.classList.remove("flash"), 2000);
  const first = card.querySelector("textarea:not([hidden]), button:not([disabled])");
  (first && first.offsetParent ? first : card).focus({ preventScroll: true });
}

function renderMe() {
  const user = userName();
  setText(el.meName, user || "?");
  const tenant = app.me?.tenant || app.claims?.tenant || "";
  setText(el.meDetail, `${tenant} · ${roles().join(", ") || "no roles"}`);
  el.me.dataset.initial = (user || "?").slice(0, 1).toUpperCase();
  setText(el.me.querySelector(".me-avatar"), el.me.dataset.initial);
}

let lastConnStatus = null;

function renderConnection(status) {
  const conn = app.client?.connection;
  if (!status || !conn) return;
  el.conn.dataset.state = status === "online" || status === "connecting" ? status : "offline";
  // For tests and debugging: a renewal keeps the socket, a reconnect opens a new one.
  el.conn.dataset.sockets = String(conn.stats.sockets);
  el.conn.dataset.renewals = String(conn.stats.renewals);
  const expired = status === "unauthorized" && app.keeper?.state === "expired";
  let label = {
    connecting: "Connecting…",
    online: "Online",
    unauthorized: expired ? "Token expired" : "Signed out",
    idle: "Offline",
    closed: "Offline",
  }[status];
  if (status === "offline") {
    const seconds = conn.retryAt ? Math.max(0, Math.ceil((conn.retryAt - Date.now()) / 1000)) : 0;
    label = seconds > 0 ? `Offline · retrying in ${seconds} s` : "Offline · retrying…";
  }
  setText(el.connLabel, label);
  el.conn.title = status === "offline" ? "Click to reconnect now" : "";
  // Named in words wherever the label is cut short (the phone's header).
  el.conn.setAttribute("aria-label", `Connection: ${label}${status === "offline" ? ". Click to reconnect now" : ""}`);
  if (status !== lastConnStatus) {
    lastConnStatus = status;
    scheduleRender(); // composer, cancel button and cards depend on being online
  }
}

el.conn.addEventListener("click", () => app.client?.connection.reconnectNow());

let toastTimer = null;
function toast(message) {
  setText(el.toast, message);
  el.toast.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => {
    el.toast.hidden = true;
  }, 6000);
}

// -- drawer (phone width) ---------------------------------------------------------------------

function closeDrawer() {
  document.body.classList.remove("drawer-open");
  el.menu.setAttribute("aria-expanded", "false");
}

el.menu.addEventListener("click", () => {
  const open = !document.body.classList.contains("drawer-open");
  document.body.classList.toggle("drawer-open", open);
  el.menu.setAttribute("aria-expanded", String(open));
  if (open) el.newChat.focus();
});
el.scrim.addEventListener("click", closeDrawer);
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") {
    closeDrawer();
    closeThreadMenu();
  }
});

// -- test and debugging hook --------------------------------------------------------------------

window.__gateway = {
  dropConnection: () => app.client?.connection.reconnect(),
  connectionStatus: () => app.client?.status ?? "closed",
  currentThreadId: () => app.current,
  stats: () => {
    const client = app.client;
    const states = client ? [...client.threads.values()].map((entry) => entry.state) : [];
    return {
      ...(client?.stats || {}),
      deltaMismatches: states.reduce((sum, state) => sum + state.mismatches, 0),
      subscribedFrom: { ...(client?.subscribedFrom || {}) },
      connection: { ...(client?.connection.stats || {}) },
    };
  },
  thread: (threadId) => loadedState(threadId || app.current),
  token: () =>
    app.keeper
      ? {
          kind: app.keeper.kind,
          state: app.keeper.state,
          expiresAt: app.keeper.times?.expiresAt ?? null,
          renewAt: app.keeper.times?.renewAt ?? null,
          renewals: app.keeper.renewals,
          failures: app.keeper.failures,
        }
      : null,
};

boot();
