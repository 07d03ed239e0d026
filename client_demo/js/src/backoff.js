// Reconnect delays: exponential back-off with "equal jitter" (half fixed, half random), so a
// gateway restart is not met by every client reconnecting in the same instant.

/**
 * @typedef {object} BackoffOptions
 * @property {number} [baseMs] first ceiling (default 500 ms)
 * @property {number} [capMs] largest ceiling (default 10 s)
 * @property {() => number} [random] a number in [0, 1) (default Math.random)
 */

/**
 * The delay before reconnect attempt `attempt` (0 for the first retry).
 * @param {number} attempt
 * @param {BackoffOptions} [options]
 * @returns {number} milliseconds
 */
export function backoffDelay(attempt, { baseMs = 500, capMs = 10_000, random = Math.random } = {}) {
  const ceiling = Math.min(capMs, baseMs * 2 ** Math.min(attempt, 30));
  return ceiling / 2 + random() * (ceiling / 2);
}
