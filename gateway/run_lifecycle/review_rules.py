"""Who may decide one particular approval, beyond the access table of docs/protocol.md §3.

`check_can_decide` (gateway/auth/access.py) answers "may this principal decide approvals on this
thread at all", given who decides the call's tool (`AgentGraph.decided_by`: the run's own user,
reviewers, or either; GATEWAY_SELF_APPROVAL for tools the graph says nothing about). The rules
here narrow that per approval:

- Per-tool reviewer roles: an agent graph may name, per tool, roles of which the decider must
  hold at least one (`AgentGraph.reviewer_roles`, e.g. `issue_refund` -> `{"finance"}`). Admins
  are not exempt: the point of naming a role is that only people trusted with that tool decide
  it, and an admin who needs to can be given the role in their token like anyone else. The rule
  covers approve and reject alike: a decision on a tool is a judgement about it either way. It
  does not apply to tools only the run's own user decides (a graph may not name both).
- Four-eyes (GATEWAY_FOUR_EYES): the user who requested a run may never approve a call of that
  run, whatever roles they hold. Rejecting stays allowed: stopping one's own call is always safe.
  It wins over `decided_by`: a tool only its user decides can then only be rejected.

Pure, like gateway/auth/access.py: callers look up the required roles and the requester and ask.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.agents.registry import AgentGraph
from gateway.auth.access import (
    AccessDenied,
    DecidedBy,
    ThreadRef,
    check_can_decide,
    default_decided_by,
)
from gateway.protocol.identity import Principal
from persistence.runs import RunRecord


@dataclass(frozen=True)
class ReviewContext:
    """What the rules need to know about one approval besides the approval itself."""

    reviewer_roles: frozenset[str]
    # The run's requester; None for runs from before it was recorded (their owner stands in).
    requested_by: str | None
    # Who decides the call: the tool's `decided_by`, else the GATEWAY_SELF_APPROVAL default.
    decided_by: DecidedBy
    # The thread's owner: the run's own user where the user decides.
    owner: str
    # The input the run answers: what a reviewer reads to know what the call is for.
    run_input: str = ""
    # The graph lets a reviewer approve the call with edited arguments.
    arguments_editable: bool = False


def review_context(
    run: RunRecord, tool_name: str, graph: AgentGraph | None, *, self_approval: bool
) -> ReviewContext:
    """What the review rules need about one approval of `run`; without a graph (it is no
    longer registered) no roles are required and the global default decides."""
    declared = graph.decider_for(tool_name) if graph else None
    return ReviewContext(
        reviewer_roles=graph.roles_for(tool_name) if graph else frozenset(),
        # Runs from before requesters were recorded: their owner asked for them.
        requested_by=run.requested_by or run.owner,
        decided_by=declared or default_decided_by(self_approval),
        owner=run.owner,
        run_input=run.input,
        arguments_editable=graph is not None and tool_name in graph.editable_arguments,
    )


def holds_any(principal: Principal, required: Iterable[str]) -> bool:
    """No required roles, or at least one of them among the principal's roles."""
    needed = frozenset(required)
    if not needed:
        return True
    held = principal.extra_roles | {role.value for role in principal.roles}
    return not held.isdisjoint(needed)


def check_reviewer_roles(principal: Principal, tool_name: str, required: Iterable[str]) -> None:
    needed = sorted(required)
    if not holds_any(principal, needed):
        raise AccessDenied(
            "forbidden",
            f"deciding {tool_name!r} needs one of the reviewer roles {', '.join(needed)}",
        )


def check_four_eyes(
    principal: Principal, requester: str | None, decision: str, *, enabled: bool
) -> None:
    if enabled and decision == "approve" and requester is not None and principal.user == requester:
        raise AccessDenied(
            "forbidden",
            "four-eyes rule: the user who requested this run may not approve its calls; "
            "another reviewer must approve (rejecting is allowed)",
        )


def check_decider(
    principal: Principal,
    thread: ThreadRef,
    tool_name: str,
    review: ReviewContext,
    decision: str,
    *,
    four_eyes: bool,
) -> None:
    """The whole rule for one decision on one approval: raises AccessDenied, or returns."""
    check_can_decide(principal, thread, self_approval=False, decided_by=review.decided_by)
    if review.decided_by is not DecidedBy.USER:
        check_reviewer_roles(principal, tool_name, review.reviewer_roles)
    check_four_eyes(principal, review.requested_by, decision, enabled=four_eyes)


def may_decide(
    principal: Principal,
    thread: ThreadRef,
    tool_name: str,
    review: ReviewContext,
    decision: str,
    *,
    four_eyes: bool,
) -> bool:
    try:
        check_decider(principal, thread, tool_name, review, decision, four_eyes=four_eyes)
    except AccessDenied:
        return False
    return True


def decision_rights(
    principal: Principal, view: dict[str, Any], *, four_eyes: bool
) -> dict[str, Any]:
    """A view with what this principal may do with it (`can_decide`, `can_approve`).

    The view must carry the review fields `approval_view` adds (`reviewer_roles`,
    `requested_by`, `decided_by`, `owner`) and be of the reader's tenant (inbox views are, and
    a run's views are read after the access check); one without them is returned as it is.
    """
    if "decided_by" not in view:
        return view
    review = ReviewContext(
        reviewer_roles=frozenset(view.get("reviewer_roles") or ()),
        requested_by=view.get("requested_by"),
        decided_by=DecidedBy(view["decided_by"]),
        owner=view["owner"],
    )
    thread = ThreadRef(tenant=principal.tenant, owner=review.owner)
    tool_name = view["tool_name"]

    def may(decision: str) -> bool:
        return may_decide(principal, thread, tool_name, review, decision, four_eyes=four_eyes)

    can_decide = may("reject")
    return {**view, "can_decide": can_decide, "can_approve": can_decide and may("approve")}
