"""Reviewer rules beyond the access table: four-eyes and per-tool reviewer roles.

- GATEWAY_FOUR_EYES: the run's requester may not approve its calls, whatever roles they hold,
  but may reject them; another reviewer approves.
- `AgentGraph.reviewer_roles`: deciding a tool's approvals needs one of its roles (admins too);
  tokens carrying a role a graph names are accepted; inbox views say who may decide.
Both rules apply over the WebSocket and the HTTP reviewer API alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.agents.demo.assistant import demo_graph
from gateway.agents.registry import AgentRegistry
from gateway.auth.access import TokenVerifier
from tests.support.agents import EffectLog
from tests.support.approvals import http_decide, refused
from tests.support.client import Client, ProtocolFailure, clients, final_text
from tests.support.gated import gated_graph
from tests.support.gateway import TEST_SECRET, Gateway
from tests.support.sqlite_file import sql

FINANCE = {"charge": frozenset({"finance"})}


async def pause(
    client: Client, text: str, thread_id: str | None = None, agent: str | None = None
) -> dict[str, Any]:
    """Start a run that pauses on one approval; the `approval.requested` data."""
    fields = {"thread_id": thread_id} if thread_id else {}
    if agent is not None:
        fields["agent"] = agent
    ack = await client.request("run.start", input=text, **fields)
    frame = await client.wait_for(
        lambda f: f.get("event") == "approval.requested" and f["run_id"] == ack["run_id"]
    )
    return {**frame["data"], "run_id": ack["run_id"], "thread_id": ack["thread_id"]}


async def completed(client: Client, run_id: str) -> str:
    await client.wait_for(lambda f: f.get("event") == "run.completed" and f["run_id"] == run_id)
    return final_text(client.events, run_id)


async def ws_decide(client: Client, approval_id: str, decision: str) -> str:
    try:
        await client.request(
            "approval.decide", approval_id=approval_id, decision=decision, reason="no"
        )
    except ProtocolFailure as exc:
        assert exc.code == "forbidden" or exc.code == "conflict", exc.frame
        return str(exc.code)
    return "ok"


def finance_tokens(gw: Gateway) -> None:
    """Let the test issue tokens with the graph's `finance` role (the gateway accepts them)."""
    gw.verifier = TokenVerifier(TEST_SECRET, custom_roles={"finance"})


# -- four-eyes ------------------------------------------------------------------------------


@pytest.mark.parametrize("roles", [("user", "reviewer"), ("admin",)])
async def test_four_eyes_requester_cannot_approve_but_can_reject(
    gateway_factory: Any, roles: tuple[str, ...]
) -> None:
    effects = EffectLog()
    async with (
        gateway_factory(AgentRegistry([gated_graph(effects)]), four_eyes=True) as gw,
        clients(gw) as open_client,
    ):
        requester = await open_client("rhea", *roles)
        bob = await open_client("bob", "reviewer")

        first = await pause(requester, "pay 1")
        failure = await refused(requester, first["approval_id"])
        assert failure.code == "forbidden"
        assert "four-eyes" in failure.frame["message"]
        response = await http_decide(gw, gw.token("rhea", *roles), first["approval_id"], "approve")
        assert response.status_code == 403
        assert "four-eyes" in response.json()["error"]["message"]
        # Still pending: another reviewer approves it.
        assert await ws_decide(bob, first["approval_id"], "approve") == "ok"
        await completed(requester, first["run_id"])
        assert effects.count("charge") == 1

        second = await pause(requester, "pay 2", thread_id=first["thread_id"])
        ack = await requester.request(
            "approval.decide",
            approval_id=second["approval_id"],
            decision="reject",
            reason="I changed my mind",
        )
        assert ack["approval"]["status"] == "rejected"
        assert "I changed my mind" in await completed(requester, second["run_id"])
        assert effects.count("charge") == 1


async def test_without_four_eyes_a_reviewer_may_approve_their_own_run(
    gateway_factory: Any,
) -> None:
    effects = EffectLog()
    async with (
        gateway_factory(AgentRegistry([gated_graph(effects)])) as gw,
        clients(gw) as open_client,
    ):
        rhea = await open_client("rhea", "user", "reviewer")
        approval = await pause(rhea, "pay 3")
        assert await ws_decide(rhea, approval["approval_id"], "approve") == "ok"
        await completed(rhea, approval["run_id"])
        assert effects.count("charge") == 1


async def test_the_requester_is_who_started_the_run_or_sent_its_input(
    gateway_factory: Any, db_path: Path
) -> None:
    # The demo agent is the default (run.input uses it): "refund" pauses, "story" streams.
    registry = AgentRegistry([demo_graph("offline"), gated_graph(EffectLog())], default="assistant")
    async with (
        gateway_factory(registry, four_eyes=True, demo_delay_ms=5) as gw,
        clients(gw) as open_client,
    ):
        alice = await open_client("alice", "user")
        adam = await open_client("adam", "admin")
        bob = await open_client("bob", "reviewer")

        started = await pause(alice, "pay 4", agent="gated")
        thread_id = started["thread_id"]
        await ws_decide(bob, started["approval_id"], "approve")
        await completed(alice, started["run_id"])

        # An admin's input on alice's idle thread starts a run that adam requested.
        by_admin = await adam.request("run.input", thread_id=thread_id, input="refund order 6")
        assert by_admin["disposition"] == "started"
        admin_approval = await adam.wait_for(
            lambda f: f.get("event") == "approval.requested" and f["run_id"] == by_admin["run_id"]
        )
        assert (await refused(adam, admin_approval["data"]["approval_id"])).code == "forbidden"
        await ws_decide(bob, admin_approval["data"]["approval_id"], "approve")
        await completed(adam, by_admin["run_id"])

        # Input queued behind a busy run starts the next run later; its sender is that run's
        # requester, and under four-eyes may not approve it.
        story = await alice.request("run.input", thread_id=thread_id, input="tell me a story")
        assert story["disposition"] == "started"
        queued = await adam.request("run.input", thread_id=thread_id, input="refund order 7")
        assert queued["disposition"] == "queued"
        await completed(alice, story["run_id"])
        later = await alice.wait_for(
            lambda f: (
                f.get("event") == "approval.requested"
                and f["run_id"] not in (started["run_id"], by_admin["run_id"], story["run_id"])
            )
        )
        assert (await refused(adam, later["data"]["approval_id"])).code == "forbidden"

    requesters = dict(sql(db_path, "SELECT run_id, requested_by FROM runs"))
    assert requesters[started["run_id"]] == "alice"
    assert requesters[by_admin["run_id"]] == "adam"
    assert requesters[story["run_id"]] == "alice"
    assert requesters[later["run_id"]] == "adam"


# -- per-tool reviewer roles ----------------------------------------------------------------


async def test_a_tool_with_reviewer_roles_needs_one_of_them_over_ws_and_http(
    gateway_factory: Any,
) -> None:
    effects = EffectLog()
    registry = AgentRegistry([gated_graph(effects, reviewer_roles=FINANCE)])
    async with gateway_factory(registry) as gw, clients(gw) as open_client:
        finance_tokens(gw)
        alice = await open_client("alice", "user")
        bob = await open_client("bob", "reviewer")
        adam = await open_client("adam", "admin")
        fay = await open_client("fay", "reviewer", "finance")
        # The graph's reviewer role is accepted and listed with the core ones.
        assert fay.welcome["roles"] == ["finance", "reviewer"]

        first = await pause(alice, "refund 1")
        for client in (bob, adam):  # admins need the role too
            for decision in ("approve", "reject"):
                failure = await refused(client, first["approval_id"], decision)
                assert failure.code == "forbidden"
                assert "finance" in failure.frame["message"]
        for user, roles in (("bob", ("reviewer",)), ("adam", ("admin",))):
            response = await http_decide(
                gw, gw.token(user, *roles), first["approval_id"], "approve"
            )
            assert response.status_code == 403
            assert "finance" in response.json()["error"]["message"]
        assert await ws_decide(fay, first["approval_id"], "approve") == "ok"
        await completed(alice, first["run_id"])

        second = await pause(alice, "refund 2", thread_id=first["thread_id"])
        response = await http_decide(
            gw, gw.token("fay", "reviewer", "finance"), second["approval_id"], "approve"
        )
        assert response.status_code == 200
        assert response.json()["approval"]["status"] == "approved"
        await completed(alice, second["run_id"])
        # An admin holding the role decides too.
        third = await pause(alice, "refund 3", thread_id=first["thread_id"])
        response = await http_decide(
            gw, gw.token("ada", "admin", "finance"), third["approval_id"], "reject"
        )
        assert response.status_code == 200
        await completed(alice, third["run_id"])
        assert effects.count("charge") == 2


async def test_an_unknown_custom_role_is_still_refused(gateway_factory: Any) -> None:
    registry = AgentRegistry([gated_graph(EffectLog(), reviewer_roles=FINANCE)])
    async with gateway_factory(registry) as gw:
        issuer = TokenVerifier(TEST_SECRET, custom_roles={"legal"})
        with pytest.raises(ProtocolFailure) as failure:
            await Client.connect(gw.ws_url, issuer.issue("lee", "acme", ["reviewer", "legal"]))
        assert failure.value.code == "unauthorized"


async def test_inbox_views_say_who_may_decide(gateway_factory: Any) -> None:
    effects = EffectLog()
    registry = AgentRegistry([gated_graph(effects, reviewer_roles=FINANCE)])
    async with gateway_factory(registry, four_eyes=True) as gw, clients(gw) as open_client:
        finance_tokens(gw)
        fay = await open_client("fay", "user", "reviewer", "finance")
        bob = await open_client("bob", "reviewer")
        for client in (fay, bob):
            await client.request("inbox.subscribe")
        approval = await pause(fay, "refund 9")
        assert approval["reviewer_roles"] == ["finance"]

        def added(client: Client) -> Any:
            return client.wait_for(
                lambda f: (
                    f.get("type") == "inbox.update"
                    and [a["approval_id"] for a in f["added"]] == [approval["approval_id"]]
                )
            )

        fay_view = (await added(fay))["added"][0]
        bob_view = (await added(bob))["added"][0]
        assert fay_view["reviewer_roles"] == bob_view["reviewer_roles"] == ["finance"]
        assert fay_view["requested_by"] == "fay"
        # fay holds the role but requested the run: she may reject, not approve.
        assert (fay_view["can_decide"], fay_view["can_approve"]) == (True, False)
        assert (bob_view["can_decide"], bob_view["can_approve"]) == (False, False)

        for user, roles, expected in (
            ("fay", ("reviewer", "finance"), (True, False)),
            ("bob", ("reviewer",), (False, False)),
            ("flo", ("reviewer", "finance"), (True, True)),
        ):
            async with gw.http() as http:
                response = await http.get(
                    "/v1/approvals",
                    headers={"Authorization": f"Bearer {gw.token(user, *roles)}"},
                )
            [view] = response.json()["approvals"]
            assert (view["can_decide"], view["can_approve"]) == expected, user
            # Existing fields stay.
            assert view["tool_name"] == "charge"
            assert view["arguments"] == {"value": "refund 9", "n": 0}

        flo = await open_client("flo", "reviewer", "finance")
        await flo.request("inbox.subscribe")
        listing = await flo.wait_for(lambda f: f.get("type") == "inbox")
        [view] = listing["approvals"]
        assert (view["can_decide"], view["can_approve"]) == (True, True)
        assert await ws_decide(flo, approval["approval_id"], "approve") == "ok"
        await completed(fay, approval["run_id"])


async def test_development_tokens_may_carry_the_graphs_reviewer_roles(gateway_factory: Any) -> None:
    effects = EffectLog()
    registry = AgentRegistry([gated_graph(effects, reviewer_roles=FINANCE)])
    # An empty GATEWAY_SECRET is development mode.
    async with gateway_factory(registry, secret="") as gw:
        async with gw.http() as http:
            ok = await http.post(
                "/v1/dev/token",
                json={"user": "fay", "tenant": "acme", "roles": ["reviewer", "finance"]},
            )
            unknown = await http.post(
                "/v1/dev/token", json={"user": "lee", "tenant": "acme", "roles": ["legal"]}
            )
            alice_token = await http.post(
                "/v1/dev/token", json={"user": "alice", "tenant": "acme", "roles": ["user"]}
            )
        assert ok.status_code == 200
        assert unknown.status_code == 400
        alice = await Client.connect(gw.ws_url, alice_token.json()["token"])
        fay = await Client.connect(gw.ws_url, ok.json()["token"])
        try:
            approval = await pause(alice, "refund 8")
            assert await ws_decide(fay, approval["approval_id"], "approve") == "ok"
            await completed(alice, approval["run_id"])
        finally:
            await alice.close()
            await fay.close()
        assert effects.count("charge") == 1
