// The reviewer inbox: every pending approval of the tenant, fed by `inbox.subscribe`
// (one `inbox` frame, then `inbox.update` frames with `added` and `removed`).

import { argsSummary, clear, h, relativeTime, setText } from "./dom.js";

export class Inbox {
  constructor() {
    this.approvals = new Map(); // approval_id -> approval (oldest first by insertion)
    this.version = 0;
    this.loaded = false;
  }

  replace(approvals) {
    this.approvals.clear();
    for (const approval of approvals || []) this.approvals.set(approval.approval_id, approval);
    this.loaded = true;
    this.version += 1;
  }

  update(added, removed) {
    for (const id of removed || []) this.approvals.delete(id);
    for (const approval of added || []) this.approvals.set(approval.approval_id, approval);
    this.version += 1;
  }

  reset() {
    this.approvals.clear();
    this.loaded = false;
    this.version += 1;
  }

  list() {
    return [...this.approvals.values()].sort((a, b) =>
      String(a.requested_at).localeCompare(String(b.requested_at)),
    );
  }
}

export class InboxView {
  /**
   * @param {HTMLElement} root  the inbox <section>
   * @param {(approval) => void} onOpen
   * @param {(threadId) => string} titleOf
   */
  constructor(root, { onOpen, titleOf }) {
    this.root = root;
    this.list = root.querySelector("[data-inbox-list]");
    this.count = root.querySelector("[data-inbox-count]");
    this.empty = root.querySelector("[data-inbox-empty]");
    this.onOpen = onOpen;
    this.titleOf = titleOf;
    this.rendered = -1;
  }

  render(inbox, { force = false } = {}) {
    if (!force && this.rendered === inbox.version) return;
    this.rendered = inbox.version;
    const approvals = inbox.list();
    setText(this.count, String(approvals.length));
    this.count.dataset.count = String(approvals.length);
    this.root.dataset.count = String(approvals.length);
    this.empty.hidden = approvals.length > 0 || !inbox.loaded;
    clear(this.list);
    for (const approval of approvals) {
      const title = this.titleOf(approval.thread_id);
      const asked = typeof approval.run_input === "string" ? approval.run_input.replace(/\s+/g, " ").trim() : "";
      const button = h(
        "button",
        {
          type: "button",
          class: "inbox-item",
          dataset: {
            testid: "inbox-item",
            approvalId: approval.approval_id,
            threadId: approval.thread_id,
          },
          onclick: () => this.onOpen(approval),
        },
        h(
          "div",
          { class: "inbox-line" },
          h("span", { class: "inbox-tool" }, approval.tool_name),
          h("span", { class: "inbox-time" }, relativeTime(approval.requested_at)),
        ),
        h("div", { class: "inbox-args" }, argsSummary(approval.arguments, 70)),
        h("div", { class: "inbox-thread", dataset: { testid: "inbox-thread" } }, title),
        // The message the call answers, when it is not the one the thread is named after.
        asked && asked !== title
          ? h("div", { class: "inbox-asked", dataset: { testid: "inbox-asked" } }, `“${asked}”`)
          : null,
      );
      this.list.append(h("li", {}, button));
    }
  }
}
