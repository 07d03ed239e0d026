// An AG-UI `HttpAgent` with what AG-UI lacks: resume from a cursor (docs/protocol.md §12).
//
// The gateway frames every AG-UI event with the seq of the stored event it comes from (the SSE
// `id:` line, which `@ag-ui/client`'s parser drops). This agent reads those ids below the
// parser and keeps, as `lastEventId`, the id of the newest stored event all of whose AG-UI
// events it has applied, so `connectAgent()` picks the conversation up exactly there: after a dropped connection, a
// reload (persist `lastEventId` with the messages), or from another device (no cursor: the
// whole conversation). Works with `@ag-ui/client` 1.0 and 0.0.x (CopilotKit's) alike: pass the
// module in, or import `GatewayAgent` from `agents-ws-gateway-client/ag-ui`.

/**
 * @param {{HttpAgent: any, runHttpRequest: Function, transformHttpEventStream: Function}} agui
 *   the `@ag-ui/client` module
 */
export function makeGatewayAgent(agui) {
  const { HttpAgent, runHttpRequest, transformHttpEventStream } = agui;

  return class GatewayAgent extends HttpAgent {
    /** @param {object} config HttpAgent's config, plus `lastEventId` to resume from */
    constructor(config) {
      super(config);
      /** The seq of the last event applied (a string, as SSE ids are), or null. */
      this.lastEventId = config.lastEventId == null ? null : String(config.lastEventId);
      // The conversation the cursor belongs to: a seq means nothing in another thread.
      this._cursorThread = this.threadId;
      this._track(this.fetch);
    }

    /**
     * Reads the ids of this agent's own responses: its fetch, and a subscriber of its own.
     *
     * One stored event can give several AG-UI events, all with its id. The cursor moves to an
     * id only once every event of it has been applied: when the next id begins, or when a
     * run's last event (which ends its stored event's events) is applied. A connection cut
     * inside one stored event's events resumes from the one before; the prelude's snapshot
     * then restates what was half applied.
     */
    _track(send) {
      // {id, type} of the frames received and not yet applied, in order: one per event.
      this._unapplied = [];
      this._group = null;
      this._appliedSinceConnect = 0;
      this._send = send;
      this.fetch = async (url, init) => this._tracked(await send(url, init));
      this._tracker = {
        onEvent: ({ event }) => {
          this._appliedSinceConnect += 1;
          // Events the client makes itself (the RUN_ERROR of an abort) have no frame.
          if (this._unapplied[0]?.type !== event.type) return;
          const { id } = this._unapplied.shift();
          if (id === null) return;
          if (this._group !== null && this._group !== id) this._advance(this._group);
          this._group = id;
          if (event.type === "RUN_FINISHED" || event.type === "RUN_ERROR") this._advance(id);
        },
      };
      this.subscribe(this._tracker);
    }

    _advance(id) {
      this.lastEventId = id;
      this._cursorThread = this.threadId;
    }

    clone() {
      // HttpAgent's clone copies the fetch and the subscribers, which would keep reading
      // into this agent's cursor: the clone gets a cursor and a tracker of its own.
      const cloned = super.clone();
      cloned.subscribers = cloned.subscribers.filter((s) => s !== this._tracker);
      cloned.lastEventId = this.lastEventId;
      cloned._cursorThread = this._cursorThread;
      cloned._track(this._send);
      return cloned;
    }

    /** `<url>/connect`: the conversation from `lastEventId`, then live. */
    get connectUrl() {
      return `${this.url.replace(/\/+$/, "")}/connect`;
    }

    connect(input) {
      const init = this.requestInit(input);
      if (this.lastEventId !== null && this._cursorThread === this.threadId) {
        init.headers = { ...init.headers, "Last-Event-ID": this.lastEventId };
      }
      return transformHttpEventStream(
        runHttpRequest(() => this.fetch(this.connectUrl, init)),
        this.debugLogger,
      );
    }

    /**
     * Follow the conversation from `lastEventId`. Interrupts this agent holds but a reviewer
     * may have decided elsewhere (the inbox, the HTTP API) do not block it: they are kept
     * only when the gateway sends nothing newer.
     */
    async connectAgent(parameters, subscriber) {
      // A previous abortRun() left the controller aborted; the connect needs its own.
      this.abortController = new AbortController();
      const held = this.pendingInterrupts;
      this.pendingInterrupts = [];
      this._appliedSinceConnect = 0;
      try {
        return await super.connectAgent(parameters, subscriber);
      } finally {
        if (this._appliedSinceConnect === 0 && this.pendingInterrupts.length === 0) {
          this.pendingInterrupts = held;
        }
      }
    }

    /** Cancel the conversation's run on the gateway (not only this client's request). */
    async stopRun() {
      const url = `${this.url.replace(/\/+$/, "")}/stop/${encodeURIComponent(this.threadId)}`;
      const response = await this.fetch(url, {
        method: "POST",
        headers: { ...this.headers, "Content-Type": "application/json" },
        body: JSON.stringify({}),
      });
      if (!response.ok) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
      return (await response.json()).stopped;
    }

    _tracked(response) {
      const type = response.headers.get("content-type") || "";
      // Only an event stream starts a new queue: a stopRun() answered while a run streams
      // must not disturb that run's.
      if (!response.ok || !response.body || !type.startsWith("text/event-stream")) return response;
      const unapplied = [];
      this._unapplied = unapplied;
      this._group = null;
      const decoder = new TextDecoder();
      let pending = "";
      const scan = new TransformStream({
        transform(chunk, controller) {
          pending += decoder.decode(chunk, { stream: true });
          let end;
          while ((end = pending.indexOf("\n\n")) >= 0) {
            const lines = pending.slice(0, end).split("\n");
            pending = pending.slice(end + 2);
            // A message with data is one event; comments (heartbeats) are none.
            const data = lines.find((line) => line.startsWith("data:"));
            if (data === undefined) continue;
            const idLine = lines.find((line) => line.startsWith("id:"));
            const type = /"type":"([A-Z_]+)"/.exec(data)?.[1];
            unapplied.push({ id: idLine === undefined ? null : idLine.slice(3).trim(), type });
          }
          controller.enqueue(chunk);
        },
      });
      return new Response(response.body.pipeThrough(scan), {
        status: response.status,
        statusText: response.statusText,
        headers: response.headers,
      });
    }
  };
}
