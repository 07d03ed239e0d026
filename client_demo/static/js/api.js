// The gateway's HTTP API (Authorization: Bearer).

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class Api {
  constructor(token) {
    this.token = token;
  }

  async get(path) {
    const response = await fetch(path, {
      headers: { Authorization: `Bearer ${this.token}`, Accept: "application/json" },
      cache: "no-store",
    });
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      throw new ApiError(
        response.status,
        body?.error?.code || "http_error",
        body?.error?.message || `HTTP ${response.status}`,
      );
    }
    return body;
  }

  async threads(limit = 100) {
    const body = await this.get(`/v1/threads?limit=${limit}`);
    return body.threads || [];
  }

  async events(threadId, { afterSeq = 0, limit = 500 } = {}) {
    return this.get(
      `/v1/threads/${encodeURIComponent(threadId)}/events?after_seq=${afterSeq}&limit=${limit}`,
    );
  }
}
