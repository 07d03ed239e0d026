"""GATEWAY_APPROVAL_TTL_S: approvals nobody decides in time are rejected by the system.

The model is told why (the expiry reason is the rejection message), `approval.decided` says
`expired: true` with no reviewer, the inbox drops the approval, the trail records the system's
action, and a human decision arriving afterwards (even before the sweep ran) gets `conflict`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from gateway.agents.registry import AgentRegistry
from tests.support.agents import EffectLog
from tests.support.approvals import http_decide, refused, requester_and_reviewer
from tests.support.client import Client, final_text
from tests.support.gated import gated_graph
from tests.support.gateway import Gateway
from tests.support.sqlite_file import sql

REASON_1S = "The approval request expired after 1 second without a decision."


def expiring(
    gateway_factory: Callable[..., AbstractAsyncContextManager[Gateway]],
    effects: EffectLog,
    *,
    ttl_s: float,
    sweep_s: float,
) -> AbstractAsyncContextManager[tuple[Gateway, Client, Client]]:
    """Alice and bob on a gateway whose approvals expire after `ttl_s`, swept every `sweep_s`."""
    registry = AgentRegistry([gated_graph(effects)])
    return requester_and_reviewer(
        gateway_factory, registry, approval_ttl_s=ttl_s, approval_sweep_s=sweep_s
    )


async def test_an_unanswered_approval_expires_and_the_model_is_told_why(
    gateway_factory: Any, db_path: Path
) -> None:
    effects = EffectLog()
    async with expiring(gateway_factory, effects, ttl_s=1, sweep_s=0.1) as (gw, alice, bob):
        await bob.request("inbox.subscribe")
        ack = await alice.request("run.start", input="pay 3")
        requested = (await alice.wait_event("approval.requested"))["data"]
        approval_id = requested["approval_id"]
        assert requested["expires_at"] is not None
        listed = await bob.wait_for(
            lambda f: (
                f.get("type") == "inbox.update"
                and [a["approval_id"] for a in f["added"]] == [approval_id]
            )
        )
        assert listed["added"][0]["expires_at"] == requested["expires_at"]

        decided = await alice.wait_event("approval.decided", timeout=10)
        assert decided["data"]["approval_id"] == approval_id
        assert decided["data"]["decision"] == "reject"
        assert decided["data"]["reviewer"] is None
        assert decided["data"]["expired"] is True
        assert decided["data"]["reason"] == REASON_1S
        await bob.wait_for(
            lambda f: f.get("type") == "inbox.update" and approval_id in f["removed"]
        )

        await alice.wait_event("run.completed")
        events = alice.events_of(ack["thread_id"])
        output = next(e for e in events if e["event"] == "tool.output")
        assert output["data"]["output"] == REASON_1S
        assert REASON_1S in final_text(events, ack["run_id"])
        assert [e["event"] for e in events].count("run.resumed") == 1
        assert effects.count("charge") == 0

        # A reviewer who comes back late is refused, over both transports.
        failure = await refused(bob, approval_id)
        assert failure.code == "conflict"
        assert "expired" in failure.frame["message"]
        response = await http_decide(gw, gw.token("bob", "reviewer"), approval_id)
        assert response.status_code == 409
        assert "expired" in response.json()["error"]["message"]

    [(status, reviewer, reason)] = sql(
        db_path,
        "SELECT status, reviewer, reason FROM approvals WHERE approval_id = ?",
        (approval_id,),
    )
    assert (status, reviewer, reason) == ("expired", None, REASON_1S)
    [(actor, outcome, details)] = sql(
        db_path,
        "SELECT actor, outcome, details FROM audit WHERE action = 'approval.expired'"
        " AND target = ?",
        (approval_id,),
    )
    assert (actor, outcome) == ("system", "success")
    assert json.loads(details)["run_id"] == ack["run_id"]


async def test_a_decision_after_expiry_is_refused_even_before_the_sweep(
    gateway_factory: Any,
) -> None:
    effects = EffectLog()
    # The sweep would only run after an hour: the late decision itself expires the approval.
    async with expiring(gateway_factory, effects, ttl_s=0.5, sweep_s=3600) as (_, alice, bob):
        ack = await alice.request("run.start", input="pay 4")
        approval_id = (await alice.wait_event("approval.requested"))["data"]["approval_id"]
        await asyncio.sleep(0.8)
        assert not [e for e in alice.events if e["event"] == "approval.decided"]

        failure = await refused(bob, approval_id)
        assert failure.code == "conflict"
        assert "expired after 0.5 seconds" in failure.frame["message"]

        decided = await alice.wait_event("approval.decided")
        assert decided["data"]["expired"] is True
        assert decided["data"]["reviewer"] is None
        await alice.wait_event("run.completed")
        reason = "The approval request expired after 0.5 seconds without a decision."
        assert reason in final_text(alice.events, ack["run_id"])
        assert [e["event"] for e in alice.events].count("approval.decided") == 1
        assert effects.count("charge") == 0


async def test_a_decision_in_time_is_not_touched_by_the_sweep(gateway_factory: Any) -> None:
    effects = EffectLog()
    async with expiring(gateway_factory, effects, ttl_s=1, sweep_s=0.1) as (_, alice, bob):
        await alice.request("run.start", input="pay 5")
        approval_id = (await alice.wait_event("approval.requested"))["data"]["approval_id"]
        await bob.request("approval.decide", approval_id=approval_id, decision="approve")
        await alice.wait_event("run.completed")
        await asyncio.sleep(1.3)  # past the TTL, with several sweeps
        decided = [e for e in alice.events if e["event"] == "approval.decided"]
        assert len(decided) == 1 and decided[0]["data"]["reviewer"] == "bob"
        assert "expired" not in decided[0]["data"]
        assert effects.count("charge") == 1
