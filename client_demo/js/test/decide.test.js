// Who may press an approval's buttons, from the thread's events (docs/protocol.md §3 "Who
// decides"): the call's `decided_by`, the reader's roles and the thread's owner.

import assert from "node:assert/strict";
import { test } from "node:test";
import { applyEvent, emptyThread, mayDecide, pendingApprovals } from "../src/index.js";

const frame = (seq, event, data) => ({ type: "event", thread_id: "t", seq, run_id: "r", event, ts: "", data });

function approvalOf(data) {
  let state = emptyThread("t");
  state = applyEvent(state, frame(1, "run.started", { input: "email", agent: "assistant" }));
  const requested = { approval_id: "ap_1", call_id: "c1", tool_name: "send_email", arguments: {}, agent: "assistant", checkpoint_version: 1, requested_at: "", ...data };
  state = applyEvent(state, frame(2, "approval.requested", requested));
  return pendingApprovals(state)[0];
}

const alice = { user: "alice", roles: ["user"], owner: "alice" };
const carol = { user: "carol", roles: ["user"], owner: "alice" };
const bob = { user: "bob", roles: ["reviewer"], owner: "alice" };
const fay = { user: "fay", roles: ["reviewer", "finance"], owner: "alice" };

test("the run's own user decides a call its tool leaves to the user; reviewers do not", () => {
  const approval = approvalOf({ decided_by: "user", reviewer_roles: [] });
  assert.deepEqual([approval.decidedBy, approval.reviewerRoles], ["user", []]);
  assert.deepEqual([alice, carol, bob].map((reader) => mayDecide(approval, reader)), [true, false, false]);
  // An owner without the `user` role is no longer the thread's user.
  assert.equal(mayDecide(approval, { user: "alice", roles: ["viewer"], owner: "alice" }), false);
});

test("either: the run's own user and reviewers; reviewer roles narrow both", () => {
  const either = approvalOf({ decided_by: "either", reviewer_roles: [] });
  assert.deepEqual([alice, carol, bob].map((reader) => mayDecide(either, reader)), [true, false, true]);
  const finance = approvalOf({ decided_by: "either", reviewer_roles: ["finance"] });
  assert.deepEqual([alice, bob, fay].map((reader) => mayDecide(finance, reader)), [false, false, true]);
});

test("reviewer, and approvals from a gateway without decided_by: reviewers and admins", () => {
  for (const data of [{ decided_by: "reviewer" }, {}]) {
    const approval = approvalOf(data);
    const admin = { user: "adam", roles: ["admin"], owner: "alice" };
    assert.deepEqual([alice, bob, admin].map((reader) => mayDecide(approval, reader)), [false, true, true]);
  }
});

test("a call a rule decided by itself becomes a decided approval item naming the rule", () => {
  let state = emptyThread("t");
  state = applyEvent(state, frame(1, "run.started", { input: "refund", agent: "assistant" }));
  const decided = { approval_id: "ap_9", call_id: "c9", tool_name: "issue_refund", decision: "approve", reason: null, reviewer: null, rule: "refund_up_to_50", decided_at: "2026-01-01T00:00:00Z" };
  state = applyEvent(state, frame(2, "approval.decided", decided));
  const [item] = state.items.filter((i) => i.kind === "approval");
  assert.deepEqual([item.id, item.callId, item.toolName, item.status, item.rule, item.reviewer], ["ap_9", "c9", "issue_refund", "approved", "refund_up_to_50", null]);
  assert.deepEqual(pendingApprovals(state), []);
  // A person's decision on an approval this client never saw requested stays ignored.
  state = applyEvent(state, frame(3, "approval.decided", { ...decided, approval_id: "ap_10", rule: undefined, reviewer: "bob" }));
  assert.equal(state.items.filter((i) => i.kind === "approval").length, 1);
});
