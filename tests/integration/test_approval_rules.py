"""Rules that decide a tool's calls by themselves (`AgentGraph.approval_rules`,
docs/protocol.md §4 "Rules that decide").

A rule sees the call's real arguments and the run's caller before the run pauses. What it
decides is logged as `approval.decided` (`reviewer: null`, the rule's name), audited and
counted; calls it leaves wait for a person; a rule that raises never approves. When rules
decide every call of a pause, the run goes on without pausing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from gateway.agents.approval_rules import ApprovalRule, Verdict
from gateway.agents.registry import AgentRegistry
from gateway.agents.run_caller import RunCaller
from tests.integration.test_audit import audit_entries
from tests.integration.test_metrics import scrape
from tests.integration.test_reviewer_rules import completed, pause, ws_decide
from tests.support.agents import EffectLog
from tests.support.client import Client, clients
from tests.support.gated import gated_graph

pytestmark = pytest.mark.both_backends


def first_only(arguments: Mapping[str, Any], caller: RunCaller) -> Verdict | None:
    """Approves the first call of a batch (n == 0), rejects "no", leaves the rest."""
    if arguments["value"].startswith("no"):
        return "reject"
    return "approve" if arguments["n"] == 0 else None


FIRST = ApprovalRule("first_only", first_only, rejection_message="The rule said no.")


def events_of(client: Client, run_id: str, event: str) -> list[dict[str, Any]]:
    return [f["data"] for f in client.events if f.get("run_id") == run_id and f["event"] == event]


async def test_a_rule_approves_every_call_and_the_run_goes_on_without_pausing(
    gateway_factory: Any,
) -> None:
    effects = EffectLog()
    registry = AgentRegistry([gated_graph(effects, approval_rules={"charge": FIRST})])
    async with gateway_factory(registry, metrics=True) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        ack = await alice.request("run.start", input="pay 1")
        answer = await completed(alice, ack["run_id"])
        assert answer.startswith("finished: charge done with")
        assert effects.count("charge") == 1
        [decided] = events_of(alice, ack["run_id"], "approval.decided")
        assert decided["reviewer"] is None and decided["rule"] == "first_only"
        assert (decided["decision"], decided["tool_name"]) == ("approve", "charge")
        assert decided["call_id"] == "call_1_0"
        assert not events_of(alice, ack["run_id"], "approval.requested")
        assert not events_of(alice, ack["run_id"], "run.paused")

        [entry] = [
            e
            for e in await audit_entries(gw, action="approval.decided")
            if e["target"] == decided["approval_id"]
        ]
        assert entry["actor"] == "system"
        assert entry["details"]["rule"] == "first_only"
        assert entry["details"]["decision"] == "approve"
        # The digest, never the arguments.
        assert "pay 1" not in str(entry)
        samples = await scrape(gw)
        rule_key = (
            "gateway_approval_rule_evaluations_total",
            (("outcome", "approve"), ("rule", "first_only")),
        )
        assert samples[rule_key] == 1
        decisions_key = ("gateway_approval_decisions_total", (("outcome", "approve"),))
        assert samples[decisions_key] == 1


async def test_a_rule_rejects_and_the_model_reads_its_message(gateway_factory: Any) -> None:
    effects = EffectLog()
    registry = AgentRegistry([gated_graph(effects, approval_rules={"charge": FIRST})])
    async with gateway_factory(registry) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        ack = await alice.request("run.start", input="no thanks")
        assert await completed(alice, ack["run_id"]) == "finished: The rule said no."
        assert effects.count("charge") == 0
        [decided] = events_of(alice, ack["run_id"], "approval.decided")
        assert (decided["decision"], decided["reason"]) == ("reject", "The rule said no.")


async def test_calls_a_rule_leaves_wait_for_a_person_with_the_rules_decisions(
    gateway_factory: Any,
) -> None:
    effects = EffectLog()
    registry = AgentRegistry([gated_graph(effects, approval_rules={"charge": FIRST}, calls=2)])
    async with gateway_factory(registry) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        bob = await open_client("bob", "reviewer")
        await bob.request("inbox.subscribe")
        waiting = await pause(alice, "pay 2")
        assert waiting["call_id"] == "call_1_1"
        [ruled] = events_of(alice, waiting["run_id"], "approval.decided")
        assert (ruled["call_id"], ruled["rule"]) == ("call_1_0", "first_only")
        # Only the call left to a person is in the inbox and in the run's pending approvals.
        update = await bob.wait_for(lambda f: f.get("type") == "inbox.update" and f["added"])
        assert [a["call_id"] for a in update["added"]] == ["call_1_1"]
        async with gw.http() as http:
            response = await http.get(
                f"/v1/runs/{waiting['run_id']}",
                headers={"Authorization": f"Bearer {gw.token('bob', 'reviewer')}"},
            )
        pending = response.json()["run"]["pending_approvals"]
        assert [a["call_id"] for a in pending] == ["call_1_1"]
        assert effects.count("charge") == 0
        assert await ws_decide(bob, waiting["approval_id"], "approve") == "ok"
        answer = await completed(alice, waiting["run_id"])
        assert answer.count("charge done with") == 2
        assert effects.count("charge") == 2


async def test_a_rule_that_raises_never_approves_and_logs_no_arguments(
    gateway_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(arguments: Mapping[str, Any], caller: RunCaller) -> Verdict | None:
        raise ValueError(f"cannot judge {arguments['value']}")

    effects = EffectLog()
    rule = ApprovalRule("broken", broken)
    registry = AgentRegistry([gated_graph(effects, approval_rules={"charge": rule})])
    async with gateway_factory(registry, metrics=True) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        bob = await open_client("bob", "reviewer")
        with caplog.at_level(logging.ERROR, logger="gateway.agents.approval_rules"):
            waiting = await pause(alice, "secret-4711")
        assert not events_of(alice, waiting["run_id"], "approval.decided")
        assert "'broken'" in caplog.text and "ValueError" in caplog.text
        assert "secret-4711" not in caplog.text
        samples = await scrape(gw)
        key = (
            "gateway_approval_rule_evaluations_total",
            (("outcome", "error"), ("rule", "broken")),
        )
        assert samples[key] == 1
        assert await ws_decide(bob, waiting["approval_id"], "reject") == "ok"
        await completed(alice, waiting["run_id"])
        assert effects.count("charge") == 0


async def test_the_demo_approves_small_refunds_for_support_users(gateway_factory: Any) -> None:
    # The demo agent's rule `refund_up_to_50` (docs/protocol.md §9), on the offline model.
    async with gateway_factory(demo_delay_ms=0) as gw, clients(gw) as open_client:
        from gateway.auth.access import TokenVerifier
        from tests.support.gateway import TEST_SECRET

        gw.verifier = TokenVerifier(TEST_SECRET, custom_roles={"support"})
        sam = await open_client("sam", "user", "support")
        ack = await sam.request("run.start", input="refund order 4 for 49.5")
        assert "Refund of 49.50 USD issued for order 4" in await completed(sam, ack["run_id"])
        [decided] = events_of(sam, ack["run_id"], "approval.decided")
        assert (decided["rule"], decided["reviewer"]) == ("refund_up_to_50", None)

        # Above 50, or from a user without the role: a person decides.
        larger = await pause(sam, "refund order 4 for 80", thread_id=ack["thread_id"])
        assert larger["tool_name"] == "issue_refund"
        alice = await open_client("alice", "user")
        small = await pause(alice, "refund order 5 for 10")
        assert not events_of(alice, small["run_id"], "approval.decided")
