"""Who may decide one particular approval, beyond the access table of docs/protocol.md §3.

`check_can_decide` (gateway/auth/access.py) answers "may this principal decide approvals on this
thread at all". The rules here narrow that per approval:

- Per-tool reviewer roles: an agent graph may name, per tool, roles of which the decider must
  hold at least one (`AgentGraph.reviewer_roles`, e.g. `issue_refund` -> `{"finance"}`). Admins
  are not exempt: the point of naming a role is that only people trusted with that tool decide
  it, and an admin who needs to can be given the role in their token like anyone else. The rule
  covers approve and reject alike: a decision on a tool is a judgement about it either way.
- Four-eyes (GATEWAY_FOUR_EYES): the user who requested a run may never approve a call of that
  run, whatever roles they hold. Rejecting stays allowed: stopping one's own call is always safe.

Pure, like gateway/auth/access.py: callers look up the required roles and the requester and ask.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.auth.access import AccessDenied, Principal


@dataclass(frozen=True)
class ReviewContext:
    """What the rules need to know about one approval besides the approval itself."""

    reviewer_roles: frozenset[str]
    # The run's requester; None for runs from before it was recorded (their owner stands in).
    requested_by: str | None


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


def decision_rights(
    principal: Principal, view: dict[str, Any], *, four_eyes: bool
) -> dict[str, Any]:
    """An inbox view with what this principal may do with it (`can_decide`, `can_approve`).

    For reviewers and admins (the inbox's audience), whom the access table already lets decide;
    the view must carry `tool_name`, `reviewer_roles` and `requested_by`.
    """
    can_decide = holds_any(principal, view.get("reviewer_roles") or ())
    requester = view.get("requested_by")
    blocked = four_eyes and requester is not None and requester == principal.user
    return {**view, "can_decide": can_decide, "can_approve": can_decide and not blocked}
