// A minimal event emitter: `on` returns the function that removes the listener. A listener
// that throws does not stop the others, nor the client that emitted the event.

export class Emitter {
  constructor() {
    /** @type {Map<string, Set<Function>>} */
    this._listeners = new Map();
  }

  /**
   * @param {string} name
   * @param {Function} listener
   * @returns {() => void} removes the listener
   */
  on(name, listener) {
    let set = this._listeners.get(name);
    if (!set) this._listeners.set(name, (set = new Set()));
    set.add(listener);
    return () => set.delete(listener);
  }

  /** @param {string} name @param {...unknown} args */
  emit(name, ...args) {
    for (const listener of [...(this._listeners.get(name) ?? [])]) {
      try {
        listener(...args);
      } catch (error) {
        // Report it without breaking the socket's message handler.
        setTimeout(() => {
          throw error;
        });
      }
    }
  }
}
