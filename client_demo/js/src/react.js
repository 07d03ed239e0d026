// React binding: `useThread(client, threadId)` renders one thread's folded state and offers
// its actions. React is a peer dependency; nothing else in the package imports it.

import { useCallback, useEffect, useState, useSyncExternalStore } from "react";
import { emptyThread } from "./thread.js";

const NO_THREAD = emptyThread("");

/**
 * Watch a thread (subscribing the client to it) and re-render on each change.
 *
 * `threadId` may be null for a conversation that does not exist yet: the first `send` starts
 * a run on a new thread, and the hook follows that thread from then on.
 *
 * The subscription outlives the component on purpose: switching back to a thread shows it
 * at once and resumes from its cursor. `client.unsubscribe(threadId)` ends it.
 *
 * @param {import("./client.js").GatewayClient} client
 * @param {string | null | undefined} threadId
 */
export function useThread(client, threadId) {
  const [id, setId] = useState(threadId ?? null);
  const [error, setError] = useState(/** @type {Error | null} */ (null));
  useEffect(() => setId(threadId ?? null), [threadId]);

  const subscribeThread = useCallback((notify) => (id ? client.on(`thread:${id}`, notify) : () => {}), [client, id]);
  const readThread = useCallback(() => (id ? client.thread(id) : NO_THREAD), [client, id]);
  const state = useSyncExternalStore(subscribeThread, readThread, readThread);

  const subscribeStatus = useCallback((notify) => client.on("status", notify), [client]);
  const readStatus = useCallback(() => client.status, [client]);
  const connection = useSyncExternalStore(subscribeStatus, readStatus, readStatus);

  useEffect(() => {
    if (id) client.subscribe(id).catch(setError);
  }, [client, id]);

  /** Run an action, keeping its failure in `error` as well as rejecting with it. */
  const act = useCallback(async (action) => {
    setError(null);
    try {
      return await action();
    } catch (failure) {
      setError(failure);
      throw failure;
    }
  }, []);

  const send = useCallback(
    (input) =>
      act(async () => {
        if (id) return client.sendInput(id, input);
        const started = await client.startRun({ input });
        setId(started.threadId);
        return { disposition: "started", runId: started.runId, threadId: started.threadId };
      }),
    [act, client, id],
  );
  const approve = useCallback((approvalId) => act(() => client.approve(approvalId)), [act, client]);
  const reject = useCallback((approvalId, reason) => act(() => client.reject(approvalId, reason)), [act, client]);
  // "Stop this run", not "disconnect": the connection and the thread stay.
  const cancel = useCallback(
    () => act(async () => (state.activeRunId ? client.cancel(state.activeRunId) : null)),
    [act, client, state.activeRunId],
  );

  return { threadId: id, state, connection, error, send, approve, reject, cancel };
}
