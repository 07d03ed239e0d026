"""Who decides a tool's calls (`AgentGraph.decided_by`, docs/protocol.md §3 "Who decides").

- `"user"`: the run's own user confirms (the "send this email?" case), reviewers may not, with
  GATEWAY_SELF_APPROVAL off; `"reviewer"`: reviewers only, even with it on; `"either"`: both.
- Every approval object says who decides (`decided_by`) and, for its reader, `can_decide` and
  `can_approve`: in `approval.requested`, the inbox, GET /v1/approvals and GET /v1/runs/{id}.
- Four-eyes still wins: a requester deciding as the user may reject, never approve.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.agents.registry import AgentRegistry
from tests.integration.test_reviewer_rules import completed, pause, ws_decide
from tests.support.agents import EffectLog
from tests.support.approvals import http_decide, refused
from tests.support.client import Client, clients
from tests.support.gated import gated_graph
from tests.support.gateway import Gateway

pytestmark = pytest.mark.both_backends


async def rights(gw: Gateway, run_id: str, user: str, *roles: str) -> tuple[bool, bool]:
    """`can_decide`, `can_approve` of the run's one pending approval, as `user` reads it."""
    async with gw.http() as http:
        response = await http.get(
            f"/v1/runs/{run_id}", headers={"Authorization": f"Bearer {gw.token(user, *roles)}"}
        )
    assert response.status_code == 200, response.text
    [view] = response.json()["run"]["pending_approvals"]
    return view["can_decide"], view["can_approve"]


async def inbox_rights(client: Client, approval_id: str) -> tuple[bool, bool]:
    await client.request("inbox.subscribe")
    listing = await client.wait_for(lambda f: f.get("type") == "inbox")
    [view] = [a for a in listing["approvals"] if a["approval_id"] == approval_id]
    return view["can_decide"], view["can_approve"]


async def test_a_tool_its_user_decides_is_confirmed_by_them_not_by_reviewers(
    gateway_factory: Any,
) -> None:
    effects = EffectLog()
    registry = AgentRegistry([gated_graph(effects, decided_by={"charge": "user"})])
    # GATEWAY_SELF_APPROVAL is off: the tool's own rule lets the user decide.
    async with gateway_factory(registry) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        bob = await open_client("bob", "reviewer")
        approval = await pause(alice, "email 1")
        assert approval["decided_by"] == "user"
        assert await rights(gw, approval["run_id"], "alice", "user") == (True, True)
        assert await rights(gw, approval["run_id"], "bob", "reviewer") == (False, False)
        assert await rights(gw, approval["run_id"], "vic", "viewer") == (False, False)
        assert await inbox_rights(bob, approval["approval_id"]) == (False, False)

        failure = await refused(bob, approval["approval_id"])
        assert failure.code == "forbidden"
        assert "own user" in failure.frame["message"]
        response = await http_decide(gw, gw.token("adam", "admin"), approval["approval_id"])
        assert response.status_code == 403
        assert effects.count("charge") == 0

        ack = await alice.request(
            "approval.decide", approval_id=approval["approval_id"], decision="approve"
        )
        assert ack["approval"]["reviewer"] == "alice"
        await completed(alice, approval["run_id"])
        assert effects.count("charge") == 1


async def test_either_lets_the_user_or_a_reviewer_decide(gateway_factory: Any) -> None:
    effects = EffectLog()
    registry = AgentRegistry([gated_graph(effects, decided_by={"charge": "either"})])
    async with gateway_factory(registry) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        bob = await open_client("bob", "reviewer")
        first = await pause(alice, "email 2")
        assert first["decided_by"] == "either"
        assert await rights(gw, first["run_id"], "alice", "user") == (True, True)
        assert await rights(gw, first["run_id"], "bob", "reviewer") == (True, True)
        assert await ws_decide(alice, first["approval_id"], "approve") == "ok"
        await completed(alice, first["run_id"])

        second = await pause(alice, "email 3", thread_id=first["thread_id"])
        assert await ws_decide(bob, second["approval_id"], "approve") == "ok"
        await completed(alice, second["run_id"])
        assert effects.count("charge") == 2
        # Another user of the tenant is neither the run's user nor a reviewer.
        third = await pause(alice, "email 4", thread_id=first["thread_id"])
        assert await rights(gw, third["run_id"], "carol", "user", "viewer") == (False, False)


async def test_reviewer_only_tools_ignore_self_approval(gateway_factory: Any) -> None:
    effects = EffectLog()
    registry = AgentRegistry(
        [
            gated_graph(effects, decided_by={"charge": "reviewer"}),
            gated_graph(effects, name="default"),
        ]
    )
    async with gateway_factory(registry, self_approval=True) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        pinned = await pause(alice, "wire 1", agent="gated")
        assert pinned["decided_by"] == "reviewer"
        assert await rights(gw, pinned["run_id"], "alice", "user") == (False, False)
        failure = await refused(alice, pinned["approval_id"])
        assert failure.code == "forbidden"
        # A tool the graph says nothing about follows GATEWAY_SELF_APPROVAL.
        default = await pause(alice, "wire 2", agent="default")
        assert default["decided_by"] == "either"
        assert await rights(gw, default["run_id"], "alice", "user") == (True, True)
        assert await ws_decide(alice, default["approval_id"], "approve") == "ok"
        await completed(alice, default["run_id"])
        assert effects.count("charge") == 1


async def test_four_eyes_wins_over_the_users_confirmation(gateway_factory: Any) -> None:
    effects = EffectLog()
    registry = AgentRegistry([gated_graph(effects, decided_by={"charge": "user"})])
    async with (
        gateway_factory(registry, four_eyes=True) as gw,
        clients(gw) as open_client,
    ):
        alice = await open_client("alice", "user")
        approval = await pause(alice, "email 5")
        assert await rights(gw, approval["run_id"], "alice", "user") == (True, False)
        failure = await refused(alice, approval["approval_id"])
        assert "four-eyes" in failure.frame["message"]
        assert await ws_decide(alice, approval["approval_id"], "reject") == "ok"
        assert "no" in await completed(alice, approval["run_id"])
        assert effects.count("charge") == 0


async def test_the_demo_agents_user_confirms_their_email(gateway_factory: Any) -> None:
    # The offline demo agent: `send_email` is "either", `issue_refund` follows the default.
    async with gateway_factory(demo_delay_ms=0) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        email = await pause(alice, "email ann@example.com about order 7")
        assert (email["tool_name"], email["decided_by"]) == ("send_email", "either")
        assert await rights(gw, email["run_id"], "alice", "user") == (True, True)
        assert await ws_decide(alice, email["approval_id"], "approve") == "ok"
        assert "Email sent to ann@example.com" in await completed(alice, email["run_id"])

        refund = await pause(alice, "refund order 7 for 20", thread_id=email["thread_id"])
        assert (refund["tool_name"], refund["decided_by"]) == ("issue_refund", "reviewer")
        assert await rights(gw, refund["run_id"], "alice", "user") == (False, False)
        assert (await refused(alice, refund["approval_id"])).code == "forbidden"
