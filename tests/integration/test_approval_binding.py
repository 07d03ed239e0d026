"""Approvals bind to what the reviewer saw: the run's checkpoint, the call id, the arguments.

Every way an approval can stop applying answers `conflict` and leaves it `superseded` (or
decided, for a replay): the run moved on, was recovered from a newer checkpoint, was cancelled,
the displayed call no longer matches the checkpoint's, or the approval was already decided.
A mismatch is modelled by editing the approval row in the SQLite file, as a display of other
arguments than the ones the SDK would execute.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from gateway.agents.registry import AgentRegistry
from gateway.run_lifecycle.approval_binding import arguments_digest
from tests.support.agents import EffectLog
from tests.support.approvals import http_decide, refused, requester_and_reviewer
from tests.support.client import Client, ProtocolFailure, clients, final_text
from tests.support.gated import gated_graph
from tests.support.gateway import Gateway
from tests.support.sqlite_file import sql


def approval_status(db_path: Path, approval_id: str) -> str:
    return str(
        sql(db_path, "SELECT status FROM approvals WHERE approval_id = ?", (approval_id,))[0][0]
    )


def add_newer_checkpoint(db_path: Path, run_id: str) -> None:
    """Copy the run's checkpoint 1 as version 2 and point the run at it, as another process
    that took the run further would have left them."""
    sql(
        db_path,
        "INSERT INTO checkpoints SELECT run_id, version + 1, state, sdk_schema_version,"
        " graph_name, graph_version, 'turn', session_mark, created_at FROM checkpoints"
        " WHERE run_id = ? AND version = 1",
        (run_id,),
    )
    sql(db_path, "UPDATE runs SET checkpoint_version = 2 WHERE run_id = ?", (run_id,))


def registry(effects: EffectLog, **kwargs: Any) -> AgentRegistry:
    return AgentRegistry([gated_graph(effects, **kwargs)])


async def requested(client: Client, *, after: Collection[str] = ()) -> dict[str, Any]:
    """The first `approval.requested` event whose approval is not in `after`."""
    frame = await client.wait_for(
        lambda f: f.get("event") == "approval.requested" and f["data"]["approval_id"] not in after
    )
    return frame["data"]


async def paused(client: Client, text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Start a run and wait until it pauses: its ack, and the approvals it asked for."""
    ack = await client.request("run.start", input=text)
    await client.wait_event("run.paused")
    return ack, [e["data"] for e in client.events if e["event"] == "approval.requested"]


def show_other_arguments(
    db_path: Path, approval_id: str, arguments: dict[str, Any], *, with_digest: bool
) -> None:
    """Make the approval display `arguments`; `with_digest` re-digests them too, so the row
    agrees with itself and only the checkpoint's call tells the difference."""
    if with_digest:
        sql(
            db_path,
            "UPDATE approvals SET arguments = ?, arguments_digest = ? WHERE approval_id = ?",
            (json.dumps(arguments), arguments_digest("charge", arguments), approval_id),
        )
    else:
        sql(
            db_path,
            "UPDATE approvals SET arguments = ? WHERE approval_id = ?",
            (json.dumps(arguments), approval_id),
        )


async def inbox_removed(reviewer: Client, approval_id: str) -> None:
    await reviewer.wait_for(
        lambda f: f.get("type") == "inbox.update" and approval_id in f["removed"]
    )


async def refused_as_superseded(reviewer: Client, db_path: Path, approval_id: str) -> None:
    """A decision on the approval is `conflict`, leaves it `superseded` and out of the inbox."""
    failure = await refused(reviewer, approval_id)
    assert failure.code == "conflict"
    assert "superseded" in failure.frame["message"]
    assert approval_status(db_path, approval_id) == "superseded"
    await inbox_removed(reviewer, approval_id)


def of_run(event: str, run_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda frame: frame.get("event") == event and frame["run_id"] == run_id


async def over_ws(client: Client, approval_id: str, decision: str) -> str:
    """A decision over the WebSocket: "ok" or the error code."""
    try:
        await client.request("approval.decide", approval_id=approval_id, decision=decision)
    except ProtocolFailure as exc:
        return str(exc.code)
    return "ok"


async def over_http(gw: Gateway, token: str, approval_id: str) -> str:
    """An approval over the HTTP API: "ok" or the error code."""
    response = await http_decide(gw, token, approval_id)
    return "ok" if response.status_code == 200 else str(response.json()["error"]["code"])


async def test_decision_after_the_run_moved_on_is_conflict_and_supersedes(
    gateway_factory: Any, db_path: Path
) -> None:
    effects = EffectLog()
    async with requester_and_reviewer(gateway_factory, registry(effects)) as (_, alice, bob):
        await bob.request("inbox.subscribe")
        ack = await alice.request("run.start", input="pay 5")
        approval = await requested(alice)
        assert approval["expires_at"] is None  # GATEWAY_APPROVAL_TTL_S is off by default
        # Another process took the run further meanwhile: a newer checkpoint exists.
        add_newer_checkpoint(db_path, ack["run_id"])

        await refused_as_superseded(bob, db_path, approval["approval_id"])
        assert not [e for e in alice.events if e["event"] == "approval.decided"]
        assert effects.count("charge") == 0


async def test_recovery_from_a_newer_checkpoint_supersedes_the_old_approval(
    gateway_factory: Any, db_path: Path
) -> None:
    effects = EffectLog()
    async with gateway_factory(registry(effects)) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        ack = await alice.request("run.start", input="pay 7")
        old = await requested(alice)
        await alice.wait_event("run.paused")
    run_id, thread_id = ack["run_id"], ack["thread_id"]
    # The gateway died after writing a newer checkpoint of the same pause, while the run was
    # marked running again: the restart recovers the run from that checkpoint.
    add_newer_checkpoint(db_path, run_id)
    sql(db_path, "UPDATE runs SET status = 'running' WHERE run_id = ?", (run_id,))

    async with requester_and_reviewer(gateway_factory, registry(effects)) as (_, alice, bob):
        await alice.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        recovered = await alice.wait_event("run.recovered")
        assert recovered["data"]["checkpoint_version"] == 2
        # The SDK asks again for the same call: a fresh approval, at a newer version.
        fresh = await requested(alice, after={old["approval_id"]})
        assert fresh["call_id"] == old["call_id"]
        assert fresh["arguments"] == old["arguments"]
        assert fresh["checkpoint_version"] == 3
        assert approval_status(db_path, old["approval_id"]) == "superseded"

        inbox = await bob.request("inbox.subscribe")
        assert inbox["type"] == "ack"
        listing = await bob.wait_for(lambda f: f.get("type") == "inbox")
        assert [a["approval_id"] for a in listing["approvals"]] == [fresh["approval_id"]]

        assert (await refused(bob, old["approval_id"])).code == "conflict"
        await bob.request("approval.decide", approval_id=fresh["approval_id"], decision="approve")
        await alice.wait_event("run.completed")
        assert effects.count("charge") == 1


@pytest.mark.parametrize("tampered", ["arguments", "digest"])
async def test_a_display_that_differs_from_the_checkpoint_is_refused_and_superseded(
    gateway_factory: Any, db_path: Path, tampered: str
) -> None:
    effects = EffectLog()
    async with requester_and_reviewer(gateway_factory, registry(effects)) as (_, alice, bob):
        await bob.request("inbox.subscribe")
        ack = await alice.request("run.start", input="pay 9")
        shown = await requested(alice)
        # "arguments": the reviewer is shown other arguments than those recorded with the
        # digest; "digest": arguments and digest agree, but not with the checkpoint's call.
        other = {"value": "pay 9000", "n": 0}
        show_other_arguments(db_path, shown["approval_id"], other, with_digest=tampered == "digest")

        await refused_as_superseded(bob, db_path, shown["approval_id"])
        assert effects.count("charge") == 0

        # The run asks again, showing the call as it really is; that approval applies.
        fresh = await requested(alice, after={shown["approval_id"]})
        assert fresh["call_id"] == shown["call_id"]
        assert fresh["arguments"] == {"value": "pay 9", "n": 0}
        await bob.request("approval.decide", approval_id=fresh["approval_id"], decision="approve")
        await alice.wait_event("run.completed")
        assert effects.calls == [{"tool": "charge", "arguments": {"value": "pay 9", "n": 0}}]
        assert "pay 9000" not in final_text(alice.events, ack["run_id"])


async def test_the_continuation_never_applies_an_approval_whose_call_differs(
    gateway_factory: Any, db_path: Path
) -> None:
    """An approval recorded as binding and altered before the continuation is not applied."""
    effects = EffectLog()
    gated = registry(effects, calls=2)
    async with requester_and_reviewer(gateway_factory, gated) as (_, alice, bob):
        _, (first, second) = await paused(alice, "pay twice")
        await bob.request("approval.decide", approval_id=first["approval_id"], decision="approve")
        other = {"value": "pay a lot", "n": 0}
        show_other_arguments(db_path, first["approval_id"], other, with_digest=True)
        await bob.request("approval.decide", approval_id=second["approval_id"], decision="approve")

        # Only the second call ran; the first pauses the run again under a fresh approval.
        again = await requested(alice, after={first["approval_id"], second["approval_id"]})
        assert again["call_id"] == first["call_id"]
        assert again["arguments"] == {"value": "pay twice", "n": 0}
        assert effects.calls == [{"tool": "charge", "arguments": {"value": "pay twice", "n": 1}}]
        assert approval_status(db_path, first["approval_id"]) == "superseded"

        await bob.request("approval.decide", approval_id=again["approval_id"], decision="approve")
        await alice.wait_event("run.completed")
        assert effects.count("charge") == 2


async def test_cancel_supersedes_pending_approvals_and_empties_the_inbox(
    gateway_factory: Any, db_path: Path
) -> None:
    effects = EffectLog()
    gated = registry(effects, calls=2)
    async with requester_and_reviewer(gateway_factory, gated) as (gw, alice, bob):
        await bob.request("inbox.subscribe")
        ack, approvals = await paused(alice, "pay later")
        ids = [approval["approval_id"] for approval in approvals]
        await bob.wait_for(
            lambda f: (
                f.get("type") == "inbox.update"
                and {a["approval_id"] for a in f["added"]} == set(ids)
            )
        )

        await alice.request("run.cancel", run_id=ack["run_id"])
        await alice.wait_event("run.cancelled")
        for approval_id in ids:
            await inbox_removed(bob, approval_id)
            assert approval_status(db_path, approval_id) == "superseded"
            failure = await refused(bob, approval_id)
            assert failure.code == "conflict"
            assert "superseded" in failure.frame["message"]
        response = await http_decide(gw, gw.token("bob", "reviewer"), ids[0])
        assert response.status_code == 409
        async with gw.http() as http:
            listing = await http.get(
                "/v1/approvals", headers={"Authorization": f"Bearer {gw.token('bob', 'reviewer')}"}
            )
        assert listing.json()["approvals"] == []
        assert effects.count("charge") == 0


async def test_a_replayed_decision_is_conflict_over_ws_and_http(gateway_factory: Any) -> None:
    effects = EffectLog()
    async with requester_and_reviewer(gateway_factory, registry(effects)) as (gw, alice, bob):
        await alice.request("run.start", input="pay once")
        approval = await requested(alice)
        await bob.request(
            "approval.decide", approval_id=approval["approval_id"], decision="approve"
        )
        for decision in ("approve", "reject"):
            failure = await refused(bob, approval["approval_id"], decision)
            assert failure.code == "conflict"
            assert "already approved" in failure.frame["message"]
        response = await http_decide(gw, gw.token("bob", "reviewer"), approval["approval_id"])
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "conflict"
        await alice.wait_event("run.completed")
        names = [e["event"] for e in alice.events]
        assert names.count("approval.decided") == 1
        assert names.count("run.resumed") == 1
        assert effects.count("charge") == 1


async def test_concurrent_ws_and_http_decisions_have_exactly_one_winner(
    gateway_factory: Any,
) -> None:
    effects = EffectLog()
    async with gateway_factory(registry(effects)) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        bob = await open_client("bob", "reviewer")
        carol = await open_client("carol", "admin")
        token = gw.token("dave", "reviewer")
        for attempt in range(3):
            ack = await alice.request("run.start", input=f"pay race {attempt}")
            approval = await alice.wait_for(of_run("approval.requested", ack["run_id"]))
            approval_id = approval["data"]["approval_id"]
            outcomes = await asyncio.gather(
                over_ws(bob, approval_id, "approve"),
                over_http(gw, token, approval_id),
                over_ws(carol, approval_id, "reject"),
            )
            assert sorted(outcomes) == ["conflict", "conflict", "ok"], outcomes
            await alice.wait_for(of_run("run.completed", ack["run_id"]))
            events = [e for e in alice.events if e["run_id"] == ack["run_id"]]
            names = [e["event"] for e in events]
            assert names.count("approval.decided") == 1
            assert names.count("run.resumed") == 1
        # One execution per approved race at most; a reject winner executes nothing.
        approved = sum(
            1
            for e in alice.events
            if e["event"] == "approval.decided" and e["data"]["decision"] == "approve"
        )
        assert effects.count("charge") == approved
