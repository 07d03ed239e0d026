// Where each thread's cursor lives between reconnects and page loads. A stored entry is
// `{epoch, seq, state}`: the cursor together with the folded state it produced, written as
// one value, so a reload shows exactly what was applied and resumes with `after_seq = seq`
// (a cursor without its state would skip events the page never showed).

/**
 * @typedef {object} CursorEntry
 * @property {string | null} epoch
 * @property {number} seq the last applied seq
 * @property {import("./thread.js").ThreadState} state
 */

/**
 * Synchronous on purpose: sessionStorage and localStorage are, and the client reads an entry
 * in the same tick as it subscribes.
 * @typedef {object} CursorStore
 * @property {(threadId: string) => CursorEntry | null} get
 * @property {(threadId: string, entry: CursorEntry) => void} set
 * @property {(threadId: string) => void} delete
 */

/** Cursors kept in memory: they survive reconnects, not page loads. @returns {CursorStore} */
export function memoryStore() {
  const entries = new Map();
  return {
    get: (threadId) => entries.get(threadId) ?? null,
    set: (threadId, entry) => void entries.set(threadId, entry),
    delete: (threadId) => void entries.delete(threadId),
  };
}

/**
 * Cursors in a Web Storage area: `sessionStorage` (one tab, survives reloads) or
 * `localStorage` (every tab, survives restarts). A full or unavailable storage only loses
 * persistence, never events: the client still holds the state in memory.
 * @param {Storage} storage
 * @param {string} [prefix]
 * @returns {CursorStore}
 */
export function webStorageStore(storage, prefix = "agw.thread.") {
  return {
    get(threadId) {
      try {
        const raw = storage.getItem(prefix + threadId);
        const entry = raw ? JSON.parse(raw) : null;
        return entry && typeof entry.seq === "number" && entry.state ? entry : null;
      } catch {
        return null;
      }
    },
    set(threadId, entry) {
      try {
        storage.setItem(prefix + threadId, JSON.stringify(entry));
      } catch {
        /* quota exceeded or storage disabled: keep going in memory */
      }
    },
    delete(threadId) {
      try {
        storage.removeItem(prefix + threadId);
      } catch {
        /* unavailable */
      }
    },
  };
}
