"""What readers see of runs and approvals, per caller.

Approval rows keep the real arguments; a view hides the graph's sensitive arguments from
anyone who is not a reviewer or admin (gateway/run_lifecycle/sensitive_arguments.py), and an inbox
view tells its reader what they may do with each approval (gateway/run_lifecycle/review_rules.py).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.agents.registry import UnknownAgentError
from gateway.auth.access import check_can_subscribe
from gateway.protocol.frames import MODEL_USAGE
from gateway.protocol.identity import Principal
from gateway.run_lifecycle.context import RunContext, thread_ref
from gateway.run_lifecycle.execution import approval_view
from gateway.run_lifecycle.review_rules import ReviewContext, decision_rights, review_context
from gateway.run_lifecycle.sensitive_arguments import (
    MASK_ALL,
    masked_call_data,
    sees_sensitive_arguments,
)
from persistence.approvals import ApprovalRecord, ApprovalStatus
from persistence.events import EventRepository
from persistence.runs import RunRecord


class Views:
    def __init__(self, ctx: RunContext, *, four_eyes: bool, self_approval: bool) -> None:
        self._ctx = ctx
        self._four_eyes = four_eyes
        self._self_approval = self_approval

    async def run_view(self, principal: Principal, run_id: str) -> dict[str, Any]:
        ctx = self._ctx
        run, thread = await ctx.run_for(principal, run_id)
        check_can_subscribe(principal, thread_ref(thread))
        pending = self.for_inbox_reader(
            principal,
            [
                self._approval_view_of_run(principal, a, run)
                for a in await ctx.approvals.for_checkpoint(run.run_id, run.checkpoint_version)
                if a.status is ApprovalStatus.PENDING
            ],
        )
        return {
            "run_id": run.run_id,
            "thread_id": run.thread_id,
            "status": run.status.value,
            "agent": run.agent,
            "graph_version": run.graph_version,
            "checkpoint_version": run.checkpoint_version,
            "pending_approvals": pending,
            "error": run.error,
            "usage": await self._usage(run),
        }

    async def _usage(self, run: RunRecord) -> dict[str, int] | None:
        """The run's tokens so far: the sums of its `model.usage` events (null before any).
        Unlike the totals a finished run's last event carries (the SDK's count), these include
        the calls of a turn a crash cut off, whose tokens were spent all the same."""
        calls = await EventRepository(self._ctx.store).for_run(
            run.thread_id, run.run_id, [MODEL_USAGE]
        )
        if not calls:
            return None
        totals = {"requests": len(calls)}
        for record in calls:
            for name, count in orjson.loads(record.data).items():
                if name.endswith("_tokens") and isinstance(count, int):
                    totals[name] = totals.get(name, 0) + count
        return totals

    async def inbox_views(self, principal: Principal) -> list[dict[str, Any]]:
        """The tenant's pending approvals for an inbox reader (a reviewer or admin), each with
        who may decide it and what this reader may do with it."""
        ctx = self._ctx
        pending = await ctx.approvals.pending_for_tenant(principal.tenant)
        runs: dict[str, RunRecord | None] = {}
        views = []
        for approval in pending:
            if approval.run_id not in runs:
                runs[approval.run_id] = await ctx.runs.get(approval.run_id)
            run = runs[approval.run_id]
            review = self._review_context(run, approval.tool_name) if run else None
            views.append(approval_view(approval, review))
        return self.for_inbox_reader(principal, views)

    async def pending_views(self, tenant: str, approval_ids: list[str]) -> list[dict[str, Any]]:
        """Inbox views of those of `approval_ids` that are still pending in `tenant` (the
        approvals another process announced), with who may decide them."""
        ctx = self._ctx
        views = []
        for approval_id in approval_ids:
            approval = await ctx.approvals.get(approval_id)
            if approval is None or approval.tenant != tenant:
                continue
            if approval.status is not ApprovalStatus.PENDING:
                continue
            run = await ctx.runs.get(approval.run_id)
            views.append(
                approval_view(
                    approval, self._review_context(run, approval.tool_name) if run else None
                )
            )
        return views

    def for_inbox_reader(
        self, principal: Principal, views: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Add `can_decide` / `can_approve` for this reader to views that carry the review
        fields (`reviewer_roles`, `requested_by`, `decided_by`, `owner`); the views are shared,
        so they are copied. Also for a run's pending approvals (`run_view`), whoever reads them."""
        return [decision_rights(principal, view, four_eyes=self._four_eyes) for view in views]

    async def view_approval(self, principal: Principal, approval: ApprovalRecord) -> dict[str, Any]:
        """The approval as this caller may see it: sensitive arguments masked for anyone who
        is not a reviewer or admin (a self-approving owner, for example)."""
        if sees_sensitive_arguments(principal):
            return approval_view(approval)
        run = await self._ctx.runs.get(approval.run_id)
        if run is None:
            return masked_call_data(approval_view(approval), approval.tool_name, MASK_ALL)
        return self._approval_view_of_run(principal, approval, run)

    def _approval_view_of_run(
        self, principal: Principal, approval: ApprovalRecord, run: RunRecord
    ) -> dict[str, Any]:
        view = approval_view(approval, self._review_context(run, approval.tool_name))
        if sees_sensitive_arguments(principal):
            return view
        try:
            sensitive = self._ctx.registry.get(run.agent).sensitive_arguments
        except UnknownAgentError:
            # The graph that knew what is sensitive is gone: hide every argument.
            return masked_call_data(view, approval.tool_name, MASK_ALL)
        return masked_call_data(view, approval.tool_name, sensitive)

    def _review_context(self, run: RunRecord, tool_name: str) -> ReviewContext:
        try:
            graph = self._ctx.registry.get(run.agent)
        except UnknownAgentError:
            graph = None  # the run cannot continue anyway; nobody is singled out
        return review_context(run, tool_name, graph, self_approval=self._self_approval)
