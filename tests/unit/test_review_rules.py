"""The pure rules: per-tool reviewer roles, four-eyes, inbox rights, approval binding."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from agents import Agent
from agents.items import ToolApprovalItem
from openai.types.responses import ResponseFunctionToolCall

from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.auth.access import AccessDenied, Principal, Role
from gateway.run_lifecycle.approval_binding import (
    arguments_digest,
    binding_problem,
    interruption_digest,
)
from gateway.run_lifecycle.review_rules import (
    check_four_eyes,
    check_reviewer_roles,
    decision_rights,
    holds_any,
)
from persistence.approvals import ApprovalRecord, ApprovalStatus


def who(user: str, *roles: Role, extra: tuple[str, ...] = ()) -> Principal:
    return Principal(user=user, tenant="acme", roles=frozenset(roles), extra_roles=frozenset(extra))


def test_no_required_roles_lets_any_decider_through() -> None:
    check_reviewer_roles(who("bob", Role.REVIEWER), "lookup", frozenset())


def test_a_required_role_is_needed_by_reviewers_and_admins_alike() -> None:
    for principal in (who("bob", Role.REVIEWER), who("adam", Role.ADMIN)):
        with pytest.raises(AccessDenied) as denied:
            check_reviewer_roles(principal, "issue_refund", frozenset({"finance"}))
        assert denied.value.code == "forbidden"
        assert "finance" in denied.value.message
    check_reviewer_roles(
        who("fay", Role.REVIEWER, extra=("finance",)), "issue_refund", frozenset({"finance"})
    )
    # Any one of several roles will do.
    assert holds_any(who("lee", Role.ADMIN, extra=("legal",)), {"finance", "legal"})


def test_four_eyes_blocks_only_the_requesters_approval() -> None:
    rhea = who("rhea", Role.REVIEWER, Role.ADMIN)
    with pytest.raises(AccessDenied) as denied:
        check_four_eyes(rhea, "rhea", "approve", enabled=True)
    assert denied.value.code == "forbidden"
    check_four_eyes(rhea, "rhea", "reject", enabled=True)
    check_four_eyes(rhea, "alice", "approve", enabled=True)
    check_four_eyes(rhea, "rhea", "approve", enabled=False)


def test_decision_rights_copy_the_view() -> None:
    view: dict[str, Any] = {
        "approval_id": "ap_1",
        "tool_name": "issue_refund",
        "reviewer_roles": ["finance"],
        "requested_by": "fay",
        "decided_by": "reviewer",
        "owner": "fay",
    }
    fay = decision_rights(who("fay", Role.REVIEWER, extra=("finance",)), view, four_eyes=True)
    bob = decision_rights(who("bob", Role.REVIEWER), view, four_eyes=True)
    flo = decision_rights(who("flo", Role.REVIEWER, extra=("finance",)), view, four_eyes=True)
    assert (fay["can_decide"], fay["can_approve"]) == (True, False)
    assert (bob["can_decide"], bob["can_approve"]) == (False, False)
    assert (flo["can_decide"], flo["can_approve"]) == (True, True)
    assert "can_decide" not in view
    # Views without the review fields (their run is gone) say nothing about rights.
    assert decision_rights(who("flo", Role.REVIEWER), {"approval_id": "ap_2"}, four_eyes=False) == {
        "approval_id": "ap_2"
    }


# who decides (decided_by) -> persona -> (can_decide, can_approve) without four-eyes
DECIDERS = {
    "alice": who("alice", Role.USER),  # the thread's owner: the run's own user
    "carol": who("carol", Role.USER),
    "bob": who("bob", Role.REVIEWER),
    "adam": who("adam", Role.ADMIN),
    "alice_reviewer": who("alice", Role.USER, Role.REVIEWER),
}
RIGHTS = {
    "user": {"alice": True, "carol": False, "bob": False, "adam": False, "alice_reviewer": True},
    "reviewer": {"alice": False, "carol": False, "bob": True, "adam": True, "alice_reviewer": True},
    "either": {"alice": True, "carol": False, "bob": True, "adam": True, "alice_reviewer": True},
}


@pytest.mark.parametrize("decided_by", list(RIGHTS))
@pytest.mark.parametrize("persona", list(DECIDERS))
def test_decided_by_says_who_may_decide(decided_by: str, persona: str) -> None:
    view = {
        "approval_id": "ap_1",
        "tool_name": "send_email",
        "reviewer_roles": [],
        "requested_by": "alice",
        "decided_by": decided_by,
        "owner": "alice",
    }
    expected = RIGHTS[decided_by][persona]
    rights = decision_rights(DECIDERS[persona], view, four_eyes=False)
    assert (rights["can_decide"], rights["can_approve"]) == (expected, expected)
    # Four-eyes wins: the requester (alice) may still reject, never approve.
    rights = decision_rights(DECIDERS[persona], view, four_eyes=True)
    approves = expected and DECIDERS[persona].user != "alice"
    assert (rights["can_decide"], rights["can_approve"]) == (expected, approves)


def test_reviewer_roles_narrow_the_user_too_where_either_decides() -> None:
    view = {
        "approval_id": "ap_1",
        "tool_name": "issue_refund",
        "reviewer_roles": ["finance"],
        "requested_by": "alice",
        "decided_by": "either",
        "owner": "alice",
    }
    assert not decision_rights(who("alice", Role.USER), view, four_eyes=False)["can_decide"]
    fin = who("alice", Role.USER, extra=("finance",))
    assert decision_rights(fin, view, four_eyes=False)["can_decide"]


def test_a_graph_refuses_an_unknown_decider_and_roles_on_a_user_tool() -> None:
    def build() -> Agent[Any]:
        return Agent(name="a")

    with pytest.raises(ValueError, match="decided_by"):
        AgentGraph(name="g", version="1", build=build, decided_by={"send_email": "owner"})
    with pytest.raises(ValueError, match="cannot also have reviewer_roles"):
        AgentGraph(
            name="g",
            version="1",
            build=build,
            decided_by={"send_email": "user"},
            reviewer_roles={"send_email": frozenset({"finance"})},
        )
    graph = AgentGraph(name="g", version="1", build=build, decided_by={"send_email": "either"})
    assert graph.decider_for("send_email") == "either"
    assert graph.decider_for("issue_refund") is None


def test_registry_collects_every_reviewer_role() -> None:
    def build() -> Agent[Any]:
        return Agent(name="a")

    registry = AgentRegistry(
        [
            AgentGraph("a", "1", build, reviewer_roles={"refund": frozenset({"finance"})}),
            AgentGraph("b", "1", build, reviewer_roles={"sue": frozenset({"legal", "finance"})}),
            AgentGraph("c", "1", build),
        ]
    )
    assert registry.reviewer_role_names() == {"finance", "legal"}
    assert registry.get("a").roles_for("refund") == {"finance"}
    assert registry.get("a").roles_for("other") == frozenset()
    hash(registry.get("a"))  # still usable as a key


def item(arguments: str, call_id: str = "call_1", name: str = "charge") -> ToolApprovalItem:
    raw = ResponseFunctionToolCall(
        type="function_call", call_id=call_id, name=name, arguments=arguments, id="fc_1"
    )
    return ToolApprovalItem(agent=Agent(name="a"), raw_item=raw)


def approval(arguments: dict[str, Any], digest: str | None = None) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id="ap_1",
        run_id="r_1",
        thread_id="t_1",
        tenant="acme",
        checkpoint_version=1,
        call_id="call_1",
        tool_name="charge",
        agent="a",
        arguments=arguments,
        arguments_digest=digest or arguments_digest("charge", arguments),
        status=ApprovalStatus.PENDING,
        reviewer=None,
        reason=None,
        requested_at=datetime.now(UTC),
        decided_at=None,
    )


def test_binding_holds_for_the_call_as_displayed_whatever_the_key_order() -> None:
    shown = approval({"amount": 5, "order": 1})
    assert binding_problem(shown, item('{"order": 1, "amount": 5}')) is None
    assert interruption_digest(item('{"order":1,"amount":5}')) == shown.arguments_digest


def test_binding_fails_for_other_arguments_a_tampered_row_or_a_missing_call() -> None:
    shown = approval({"amount": 5, "order": 1})
    assert binding_problem(shown, item('{"order": 1, "amount": 500}')) is not None
    assert binding_problem(shown, None) is not None
    tampered = approval({"amount": 5, "order": 1}, digest=arguments_digest("charge", {"x": 1}))
    assert binding_problem(tampered, item('{"order": 1, "amount": 5}')) is not None
    # The digest names the tool too: the same arguments for another tool do not bind.
    assert binding_problem(shown, item('{"order": 1, "amount": 5}', name="refund")) is not None
