// useChat on the gateway: the Vercel AI SDK's own hook over its WebSocketChatTransport, against
// the demo gateway (docs/frontend.md "Vercel AI SDK"). What an app adds to a plain useChat page:
// a bearer token in the transport's headers, the chat's past from the gateway's /messages,
// resume: true, and approve/reject buttons where the gateway says this reader may decide.
import { useChat } from "@ai-sdk/react";
import { WebSocketChatTransport } from "ai";
import { useEffect, useMemo, useState } from "react";
import { createRoot } from "react-dom/client";

const SESSION_KEY = "gateway-ai-sdk-example";

// -- signing in: the development token endpoint (docs/protocol.md §8) -------------------------

function storedSession() {
  try {
    const session = JSON.parse(sessionStorage.getItem(SESSION_KEY) ?? "null");
    // A token past its exp would only give errors: sign in again instead.
    return session && session.exp * 1000 > Date.now() + 30_000 ? session : null;
  } catch {
    return null;
  }
}

async function signIn(user, role) {
  const answer = await fetch("/v1/dev/token", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ user, roles: [role] }),
  });
  if (!answer.ok) throw new Error(await errorText(answer));
  const { token } = await answer.json();
  const claims = JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/")));
  const session = { token, user, role, exp: claims.exp };
  sessionStorage.setItem(SESSION_KEY, JSON.stringify(session));
  return session;
}

async function errorText(answer) {
  try {
    const { error } = await answer.json();
    return `${error.code}: ${error.message}`;
  } catch {
    return answer.status === 404
      ? "no development tokens here (the gateway has GATEWAY_SECRET or a JWKS set)"
      : `HTTP ${answer.status}`;
  }
}

// -- the chat id lives in the address, so a reload rejoins the same chat -----------------------

function chatIdFromAddress() {
  const url = new URL(location.href);
  const id = url.searchParams.get("chat");
  return id && /^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$/.test(id) ? id : null;
}

function showChat(id) {
  const url = new URL(location.href);
  url.searchParams.set("chat", id);
  history.replaceState(null, "", url);
}

function newChatId() {
  return `chat-${crypto.randomUUID()}`;
}

// -- the page ---------------------------------------------------------------------------------

function App() {
  const [session, setSession] = useState(storedSession);
  const [chatId, setChatId] = useState(() => chatIdFromAddress() ?? newChatId());
  useEffect(() => showChat(chatId), [chatId]);

  return (
    <div className="page">
      <header className="bar">
        <strong>useChat on the gateway</strong>
        {session && (
          <>
            <span className="who" data-testid="who">
              {session.user} ({session.role})
            </span>
            <button type="button" className="quiet" onClick={() => setChatId(newChatId())}>
              New chat
            </button>
            <button
              type="button"
              className="quiet"
              onClick={() => {
                sessionStorage.removeItem(SESSION_KEY);
                setSession(null);
              }}
            >
              Sign out
            </button>
          </>
        )}
      </header>
      {session ? (
        <History key={`${session.token}/${chatId}`} session={session} chatId={chatId} />
      ) : (
        <SignIn onSignedIn={setSession} />
      )}
    </div>
  );
}

function SignIn({ onSignedIn }) {
  const [user, setUser] = useState("alice");
  const [role, setRole] = useState("user");
  const [error, setError] = useState(null);
  const submit = async (event) => {
    event.preventDefault();
    setError(null);
    try {
      onSignedIn(await signIn(user.trim(), role));
    } catch (failure) {
      setError(String(failure.message ?? failure));
    }
  };
  return (
    <form className="card signin" onSubmit={submit} data-testid="signin">
      <h1>Sign in to the demo gateway</h1>
      <label>
        User
        <input value={user} onChange={(e) => setUser(e.target.value)} data-testid="signin-user" />
      </label>
      <label>
        Role
        <select value={role} onChange={(e) => setRole(e.target.value)} data-testid="signin-role">
          <option value="user">user</option>
          <option value="reviewer">reviewer</option>
        </select>
      </label>
      <button type="submit" disabled={!user.trim()} data-testid="signin-submit">
        Sign in
      </button>
      {error && <ErrorNote text={error} />}
    </form>
  );
}

// The chat's past comes from the gateway, so useChat starts from the server's truth.
function History({ session, chatId }) {
  const [loaded, setLoaded] = useState(null);
  useEffect(() => {
    let current = true;
    fetch(`/v1/ai-sdk/chat/${encodeURIComponent(chatId)}/messages`, {
      headers: { authorization: `Bearer ${session.token}` },
    })
      .then(async (answer) => {
        if (!answer.ok) throw new Error(await errorText(answer));
        const { messages } = await answer.json();
        if (current) setLoaded({ messages });
      })
      .catch((failure) => current && setLoaded({ error: String(failure.message ?? failure) }));
    return () => {
      current = false;
    };
  }, [session, chatId]);

  if (loaded === null) return <p className="muted">Loading the chat…</p>;
  if (loaded.error) return <ErrorNote text={loaded.error} />;
  return <Chat session={session} chatId={chatId} initialMessages={loaded.messages} />;
}

const SETTLED = new Set(["output-available", "output-error", "output-denied", "approval-responded"]);

// The AI SDK's lastAssistantMessageIsCompleteWithApprovalResponses, except that a call only a
// reviewer may decide does not hold the reader's answers back: the gateway ends the response at
// a pause with calls the reader decides, and follows the run through the reviewer's decisions
// once the reader's answers are in (docs/protocol.md §11).
function readerAnsweredTheStep({ messages }) {
  const message = messages.at(-1);
  if (message?.role !== "assistant") return false;
  const stepStart = message.parts.findLastIndex((part) => part.type === "step-start");
  const calls = message.parts
    .slice(stepStart + 1)
    .filter((part) => part.type.startsWith("tool-") || part.type === "dynamic-tool");
  const settled = (part) => SETTLED.has(part.state) && part.preliminary !== true;
  const reviewers = (part) =>
    part.state === "approval-requested" && part.approval?.descriptor?.canDecide === false;
  return (
    calls.some((part) => part.state === "approval-responded") &&
    calls.every((part) => settled(part) || reviewers(part))
  );
}

function Chat({ session, chatId, initialMessages }) {
  const transport = useMemo(
    () =>
      new WebSocketChatTransport({
        url: new URL("/v1/ai-sdk/ws", location.href).href,
        // Browsers cannot set handshake headers: the gateway reads the token from each frame.
        headers: { authorization: `Bearer ${session.token}` },
      }),
    [session.token],
  );
  useEffect(() => () => transport.close(), [transport]);

  const { messages, sendMessage, addToolApprovalResponse, stop, status, error, clearError } =
    useChat({
      id: chatId,
      transport,
      messages: initialMessages,
      // Rejoins the active response after a reload: the gateway replays it from its start.
      resume: true,
      // Once every approval this reader may decide is answered, useChat sends the answers by
      // itself and the gateway continues the same assistant message.
      sendAutomaticallyWhen: readerAnsweredTheStep,
    });
  const [input, setInput] = useState("");
  const busy = status === "submitted" || status === "streaming";

  const submit = (event) => {
    event.preventDefault();
    const text = input.trim();
    if (!text || busy) return;
    clearError();
    setInput("");
    sendMessage({ text });
  };

  return (
    <main className="chat" data-testid="chat" data-chat-id={chatId} data-status={status}>
      <p className="muted small">
        chat <code data-testid="chat-id">{chatId}</code> · <span data-testid="status">{status}</span>
      </p>
      <ol className="messages">
        {messages.length === 0 && (
          <li className="muted hint">
            Try “refund order 42 for 30 dollars” or “tell me a story about a lighthouse”.
          </li>
        )}
        {messages.map((message) => (
          <Message key={message.id} message={message} onDecide={addToolApprovalResponse} />
        ))}
      </ol>
      {error && <ErrorNote text={error.message ?? String(error)} />}
      <form className="composer" onSubmit={submit}>
        <input
          value={input}
          onChange={(e) => setInput(e.target.value)}
          placeholder="Message the assistant"
          aria-label="Message"
          data-testid="composer-input"
        />
        {busy ? (
          // stop() sends the transport's `abort`: the gateway cancels the run, and the text
          // streamed so far stays in the message. Closing the tab does not stop anything.
          <button type="button" className="danger" onClick={() => stop()} data-testid="stop">
            Stop
          </button>
        ) : (
          <button type="submit" disabled={!input.trim()} data-testid="send">
            Send
          </button>
        )}
      </form>
    </main>
  );
}

function Message({ message, onDecide }) {
  return (
    <li className={`message ${message.role}`} data-testid="message" data-role={message.role}>
      <span className="role">{message.role === "user" ? "You" : "Assistant"}</span>
      {message.parts.map((part, index) => {
        if (part.type === "text") {
          return (
            <p key={index} className="text" data-testid="message-text">
              {part.text}
            </p>
          );
        }
        if (part.type.startsWith("tool-") || part.type === "dynamic-tool") {
          return <ToolCall key={part.toolCallId} part={part} onDecide={onDecide} />;
        }
        return null; // step boundaries and data parts: nothing to show here
      })}
    </li>
  );
}

const STATES = {
  "input-streaming": "preparing",
  "input-available": "running",
  "approval-requested": "needs approval",
  "approval-responded": "answered",
  "output-available": "done",
  "output-error": "failed",
  "output-denied": "rejected",
};

function ToolCall({ part, onDecide }) {
  const name = part.type === "dynamic-tool" ? part.toolName : part.type.slice("tool-".length);
  const [reason, setReason] = useState("");
  const approval = part.approval;
  return (
    <div className={`tool ${part.state}`} data-testid="tool" data-state={part.state}>
      <div className="tool-head">
        <code>{name}</code>
        <span className="badge" data-testid="tool-state">
          {STATES[part.state] ?? part.state}
        </span>
      </div>
      {part.input !== undefined && <pre className="small">{JSON.stringify(part.input)}</pre>}
      {part.state === "approval-requested" &&
        // The gateway says whether this reader may decide (tool reviewer roles, four-eyes):
        // buttons only for those who may press them.
        (approval?.descriptor?.canDecide ? (
          <div className="decide">
            <input
              value={reason}
              onChange={(e) => setReason(e.target.value)}
              placeholder="Reason (optional)"
              aria-label="Reason"
              data-testid="reason"
            />
            <button
              type="button"
              onClick={() => onDecide({ id: approval.id, approved: true, reason: reason || undefined })}
              data-testid="approve"
            >
              Approve
            </button>
            <button
              type="button"
              className="danger"
              onClick={() =>
                onDecide({ id: approval.id, approved: false, reason: reason || undefined })
              }
              data-testid="reject"
            >
              Reject
            </button>
          </div>
        ) : (
          <p className="muted small" data-testid="waiting-reviewer">
            Waiting for a reviewer…
          </p>
        ))}
      {part.state === "output-available" && (
        <p className="small" data-testid="tool-output">
          {typeof part.output === "string" ? part.output : JSON.stringify(part.output)}
        </p>
      )}
      {part.state === "output-error" && <p className="small failed">{part.errorText}</p>}
      {part.state === "output-denied" && (
        <p className="small failed">Rejected{approval?.reason ? `: ${approval.reason}` : ""}</p>
      )}
    </div>
  );
}

function ErrorNote({ text }) {
  return (
    <p className="error" role="alert" data-testid="error">
      {text}
    </p>
  );
}

createRoot(document.getElementById("root")).render(<App />);
