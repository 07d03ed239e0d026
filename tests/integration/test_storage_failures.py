"""Storage that fails for a while and comes back (invariant 8 of docs/architecture.md "Invariants").

A real in-process gateway on a real SQLite file; `tests.support.faults` makes chosen statements on
the gateway's own engine fail with SQLite's `disk I/O error`, then heals. Checked: nothing that
was not stored reaches a client, a pause whose checkpoint cannot be written is neither announced
nor lost, a storage blip mid-turn does not fail the run, a decision that cannot be recorded
answers `unavailable` and changes nothing, a recorded decision still continues its run, and
everything completes exactly once when storage is back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
from agents import Agent
from agents.testing import ModelStep, ScriptedModel

import gateway.run_lifecycle.execution as execution
from gateway.agents.registry import AgentGraph, AgentRegistry
from tests.support.agents import EffectLog, call, effect_tool, say
from tests.support.client import Client, ProtocolFailure, final_text
from tests.support.faults import (
    Fault,
    Predicate,
    any_write,
    checkpoint_writes,
    commits,
    every_statement,
    faulty_gateway,
    from_first,
    lease_takes,
    select_one,
    writes_containing,
    writes_to,
)
from tests.support.gateway import Gateway, running_gateway
from tests.support.gateway import test_settings as settings_for
from tests.support.storage import rows

pytestmark = pytest.mark.both_backends

AGENT = "charger"
# Storage health's probe interval while storage fails: readiness returns within a moment.
PROBE_S = 0.1
FINAL = "charged and finished"
PAUSE_EVENTS = ("approval.requested", "run.paused")

Opener = Callable[..., Awaitable[Client]]


# -- fixtures and helpers ------------------------------------------------------------------


def charger_registry(effects: EffectLog) -> AgentRegistry:
    """`charger` looks an order up (no approval), then charges it (approval), then finishes.

    Answers depend only on the conversation so far, so a recovered run replays identically:
    the lookup ends a turn (a turn checkpoint), the charge pauses the run (a pause checkpoint).
    """

    def respond(model_call: Any) -> Any:
        items = model_call.input if isinstance(model_call.input, list) else []
        outputs = {
            item.get("call_id")
            for item in items
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        }
        if "call_charge_1" in outputs:
            return [say(FINAL)]
        if "call_lookup_1" in outputs:
            return [say("charging now"), call("charge", "call_charge_1", value="5")]
        return [say("looking the order up"), call("lookup", "call_lookup_1", value="order 5")]

    def build() -> Agent[Any]:
        return Agent(
            name=AGENT,
            instructions="charge orders",
            model=ScriptedModel([ModelStep.respond(respond) for _ in range(50)]),
            tools=[
                effect_tool(effects, "lookup", needs_approval=False),
                effect_tool(effects, "charge", needs_approval=True),
            ],
        )

    return AgentRegistry([AgentGraph(name=AGENT, version="1", build=build)], default=AGENT)


@asynccontextmanager
async def clients(gw: Gateway) -> AsyncIterator[Opener]:
    opened: list[Client] = []

    async def open_client(user: str = "alice", *roles: str) -> Client:
        client = await Client.connect(gw.ws_url, gw.token(user, *roles))
        opened.append(client)
        return client

    try:
        yield open_client
    finally:
        for client in opened:
            await client.close()


def names(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in events]


def assert_dense(events: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


async def stored_events(database_url: str, thread_id: str) -> list[tuple[int, str]]:
    query = "SELECT seq, type FROM events WHERE thread_id = ? ORDER BY seq"
    return await rows(database_url, query, thread_id)


def inbox_added(reviewer: Client) -> list[str]:
    return [
        view["approval_id"]
        for frame in reviewer.frames
        if frame.get("type") in ("inbox", "inbox.update")
        for view in frame.get("added", frame.get("approvals", []))
    ]


def inbox_removed(reviewer: Client) -> list[str]:
    return [
        approval_id
        for frame in reviewer.frames
        if frame.get("type") == "inbox.update"
        for approval_id in frame.get("removed", [])
    ]


async def eventually(check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


async def run_view(gw: Gateway, run_id: str) -> dict[str, Any]:
    async with gw.http() as http:
        response = await http.get(
            f"/v1/runs/{run_id}", headers={"authorization": f"Bearer {gw.token('alice')}"}
        )
    assert response.status_code == 200, response.text
    return response.json()["run"]


async def pending_approvals(gw: Gateway) -> list[dict[str, Any]]:
    async with gw.http() as http:
        response = await http.get(
            "/v1/approvals", headers={"authorization": f"Bearer {gw.token('bob', 'reviewer')}"}
        )
    assert response.status_code == 200, response.text
    return list(response.json()["approvals"])


async def start_until_lookup(alice: Client) -> tuple[str, str]:
    ack = await alice.request("run.start", input="charge order 5", agent=AGENT)
    await alice.wait_event("tool.output", call_id="call_lookup_1")
    return ack["thread_id"], ack["run_id"]


def assert_nothing_paused(client: Client, thread_id: str) -> None:
    seen = names(client.events_of(thread_id))
    assert not [name for name in seen if name in PAUSE_EVENTS], seen


# -- 1. the pause's checkpoint cannot be written -------------------------------------------


PAUSE_FAULTS: dict[str, tuple[Callable[[], Predicate], Fault]] = {
    # Only the pause's checkpoint insert fails (the transaction rolls back as a whole).
    "checkpoint_insert": (lambda: checkpoint_writes("approval"), Fault.IO),
    # The disk goes away at the pause: every write fails from then on (lease renewals too).
    "all_writes_from_the_pause": (
        lambda: from_first(checkpoint_writes("approval"), any_write),
        Fault.IO,
    ),
    # The disk fills up, or the database turns read-only, at the pause.
    "disk_full_from_the_pause": (
        lambda: from_first(checkpoint_writes("approval"), any_write),
        Fault.DISK_FULL,
    ),
    "read_only_from_the_pause": (
        lambda: from_first(checkpoint_writes("approval"), any_write),
        Fault.READ_ONLY,
    ),
    # Every statement of the pause's transaction runs, then its COMMIT fails (and every
    # commit after it, until healed): nothing of the transaction may remain.
    "commit_after_the_pause_writes": (
        lambda: from_first(checkpoint_writes("approval"), commits),
        Fault.IO,
    ),
    # Another connection holds the database's lock from the pause on.
    "locked_from_the_pause": (
        lambda: from_first(checkpoint_writes("approval"), any_write),
        Fault.LOCKED,
    ),
}


@pytest.mark.parametrize("fault", sorted(PAUSE_FAULTS))
async def test_pause_checkpoint_failure_is_retried_and_announced_once(
    database_url: str, fault: str
) -> None:
    """Storage fails for ~1 s at the pause: nothing is announced until the pause is stored."""
    effects = EffectLog()
    async with (
        faulty_gateway(settings_for(database_url), charger_registry(effects)) as fg,
        clients(fg.gateway) as connect,
    ):
        gw, faults = fg.gateway, fg.faults
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        await bob.request("inbox.subscribe")
        await bob.wait_for(lambda f: f.get("type") == "inbox")

        predicate, kind = PAUSE_FAULTS[fault]
        faults.fail(predicate(), kind)
        thread_id, run_id = await start_until_lookup(alice)
        # storage_retry tries at 0, 0.2 and 0.7 s after the first failure, then at 1.7 s.
        await faults.wait_hits(1)
        await asyncio.sleep(1.0)
        assert faults.hits >= 2, faults.failed  # retried, not given up on

        assert_nothing_paused(alice, thread_id)
        assert inbox_added(bob) == []
        assert await pending_approvals(gw) == []
        view = await run_view(gw, run_id)
        assert view["status"] == "running" and view["checkpoint_version"] == 1  # the turn's
        stored = [t for _, t in await stored_events(database_url, thread_id)]
        assert not [t for t in stored if t in PAUSE_EVENTS]
        assert await rows(
            database_url, "SELECT count(*) FROM approvals WHERE run_id = ?", run_id
        ) == [(0,)]

        failed_attempts = faults.hits
        faults.heal()
        paused = await alice.wait_event("run.paused", timeout=10)
        assert paused["data"] == {"reason": "approval", "checkpoint_version": 2}
        requested = [e for e in alice.events_of(thread_id) if e["event"] == "approval.requested"]
        assert len(requested) == 1
        approval_id = requested[0]["data"]["approval_id"]
        assert requested[0]["data"]["checkpoint_version"] == 2
        await bob.wait_for(lambda f: approval_id in inbox_added(bob))
        assert inbox_added(bob) == [approval_id]
        assert [a["approval_id"] for a in await pending_approvals(gw)] == [approval_id]
        assert faults.hits == failed_attempts

        ack = await bob.request("approval.decide", approval_id=approval_id, decision="approve")
        assert ack["approval"]["status"] == "approved"
        await alice.wait_event("run.completed", timeout=10)

        events = alice.events_of(thread_id)
        seen = names(events)
        assert seen.count("approval.requested") == 1
        assert seen.count("run.paused") == 1
        assert seen.count("run.resumed") == 1
        assert "run.failed" not in seen
        assert FINAL in final_text(events, run_id)
        assert_dense(events)
        assert [(e["seq"], e["event"]) for e in events] == await stored_events(
            database_url, thread_id
        )
        assert effects.count("lookup") == 1
        assert effects.count("charge") == 1
        # The failed attempts used no version: the turn (1), the pause (2, as announced), the
        # continuation's turn (3) and the final state (4), which alone is kept (the older ones
        # were pruned as each newer one was stored).
        checkpoints = await rows(
            database_url,
            "SELECT version, reason FROM checkpoints WHERE run_id = ? ORDER BY 1",
            run_id,
        )
        assert checkpoints == [(4, "completed")]
        assert await rows(
            database_url, "SELECT checkpoint_version FROM runs WHERE run_id = ?", run_id
        ) == [(4,)]
        assert await rows(
            database_url, "SELECT checkpoint_version FROM approvals WHERE run_id = ?", run_id
        ) == [(2,)]
        assert await rows(
            database_url, "SELECT status FROM approvals WHERE run_id = ?", run_id
        ) == [("approved",)]


async def test_a_cancel_while_the_pause_is_stored_cancels_the_paused_run(
    database_url: str,
) -> None:
    """A cancel that reaches the run while its pause is being stored (here: retried after a
    failure) comes too late for the segment, which has ended its stream; its ack waits for the
    pause, and then the paused run is cancelled, its approval superseded, the call never run."""
    effects = EffectLog()
    async with (
        faulty_gateway(settings_for(database_url), charger_registry(effects)) as fg,
        clients(fg.gateway) as connect,
    ):
        gw, faults = fg.gateway, fg.faults
        alice = await connect("alice", "user")
        faults.fail(checkpoint_writes("approval"))
        thread_id, run_id = await start_until_lookup(alice)
        await faults.wait_hits(1)
        cancel = asyncio.create_task(alice.request("run.cancel", run_id=run_id))
        await asyncio.sleep(0.3)
        assert not cancel.done()
        faults.heal()
        ack = await asyncio.wait_for(cancel, 10)
        assert ack["type"] == "ack"

        # The ack came after `run.cancelled` was stored.
        stored = [t for _, t in await stored_events(database_url, thread_id)]
        assert stored[-3:] == ["approval.requested", "run.paused", "run.cancelled"], stored
        assert (await run_view(gw, run_id))["status"] == "cancelled"
        assert await rows(
            database_url, "SELECT status FROM approvals WHERE run_id = ?", run_id
        ) == [("superseded",)]
        assert await pending_approvals(gw) == []
        assert effects.count("charge") == 0
        await alice.wait_event("run.cancelled", timeout=10)


async def test_pause_checkpoint_failure_past_retry_window_keeps_run_for_restart(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storage stays down longer than the gateway retries: the run is neither failed nor lost,
    and a restarted gateway continues it from its newest checkpoint (the lookup's turn)."""
    # The real window is ~16 s (0.2 + 0.5 + 1 + 2 + 4 + 8); a short one exercises the same path.
    retry_delays = (0.05, 0.1, 0.2)
    monkeypatch.setattr(execution.storage_retry, "__defaults__", (retry_delays,))
    effects = EffectLog()
    registry = charger_registry(effects)

    async with faulty_gateway(settings_for(database_url), registry) as fg, clients(fg.gateway) as c:
        gw, faults = fg.gateway, fg.faults
        alice = await c("alice", "user")
        faults.fail(checkpoint_writes("approval"))
        thread_id, run_id = await start_until_lookup(alice)
        await faults.wait_hits(len(retry_delays) + 1)
        await eventually(lambda: not fg.services.runs.is_executing(run_id))
        await asyncio.sleep(0.3)
        assert faults.hits == len(retry_delays) + 1, faults.failed  # gave up, no more writes

        assert_nothing_paused(alice, thread_id)
        view = await run_view(gw, run_id)
        assert view["status"] == "running", view
        assert view["error"] is None
        assert view["checkpoint_version"] == 1
        assert view["pending_approvals"] == []
        assert await pending_approvals(gw) == []
        assert await rows(
            database_url, "SELECT status, checkpoint_version FROM runs WHERE run_id = ?", run_id
        ) == [("running", 1)]
        stored = [t for _, t in await stored_events(database_url, thread_id)]
        assert "run.failed" not in stored
        assert not [t for t in stored if t in PAUSE_EVENTS]
        assert effects.count("charge") == 0
        faults.heal()

    async with running_gateway(settings_for(database_url), registry) as gw2, clients(gw2) as c2:
        alice = await c2("alice", "user")
        bob = await c2("bob", "reviewer")
        await alice.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        paused = await alice.wait_event("run.paused", timeout=10)
        assert paused["data"] == {"reason": "approval", "checkpoint_version": 2}
        recovered = await alice.wait_event("run.recovered")
        assert recovered["data"]["checkpoint_version"] == 1
        requested = [e for e in alice.events_of(thread_id) if e["event"] == "approval.requested"]
        assert len(requested) == 1
        await bob.request(
            "approval.decide", approval_id=requested[0]["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed", timeout=10)

        events = alice.events_of(thread_id)
        seen = names(events)
        assert {e["run_id"] for e in events} == {run_id}
        assert seen.count("run.started") == 1
        assert seen.count("run.recovered") == 1
        assert seen.count("approval.requested") == 1
        assert seen.count("run.paused") == 1
        assert "run.failed" not in seen
        assert seen.index("run.recovered") < seen.index("approval.requested")
        assert FINAL in final_text(events, run_id)
        assert_dense(events)
        # Continued from the turn checkpoint: the lookup is not repeated; the charge runs once.
        assert effects.count("lookup") == 1
        assert effects.count("charge") == 1
        assert await rows(database_url, "SELECT status FROM runs WHERE run_id = ?", run_id) == [
            ("completed",)
        ]


# -- 1b. a write inside a streaming turn fails ------------------------------------------------


async def test_session_write_failure_mid_turn_does_not_fail_the_run(database_url: str) -> None:
    """One write fails: the SDK storing the finished lookup turn in its session (the same
    SQLite file). The run's state is durable up to its last checkpoint and nothing was
    decided, so a storage blip must not end it as `failed`; it continues once storage is back
    (here at the latest after a restart)."""
    effects = EffectLog()
    registry = charger_registry(effects)
    async with faulty_gateway(settings_for(database_url), registry) as fg, clients(fg.gateway) as c:
        gw, faults = fg.gateway, fg.faults
        alice = await c("alice", "user")
        faults.fail(writes_containing("agent_messages", "call_lookup_1"))
        ack = await alice.request("run.start", input="charge order 5", agent=AGENT)
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        await faults.wait_hits(1)
        await asyncio.sleep(0.3)
        faults.heal()
        await asyncio.sleep(1.0)  # let whatever the gateway does after the blip settle

        seen = names(alice.events_of(thread_id))
        assert "run.failed" not in seen, [e["data"] for e in alice.events if "error" in e["data"]]
        view = await run_view(gw, run_id)
        assert view["status"] not in ("failed", "cancelled"), view
        assert effects.count("charge") == 0 or view["status"] == "completed"

    async with running_gateway(settings_for(database_url), registry) as gw2, clients(gw2) as c2:
        alice = await c2("alice", "user")
        bob = await c2("bob", "reviewer")
        await alice.request("thread.subscribe", thread_id=thread_id, after_seq=0)
        requested = await alice.wait_event("approval.requested", timeout=10)
        await bob.request(
            "approval.decide", approval_id=requested["data"]["approval_id"], decision="approve"
        )
        await alice.wait_event("run.completed", timeout=10)
        events = alice.events_of(thread_id)
        seen = names(events)
        assert seen.count("approval.requested") == 1
        assert "run.failed" not in seen
        assert FINAL in final_text(events, run_id)
        assert_dense(events)
        assert effects.count("lookup") == 1  # the ledger keeps the replayed lookup from rerunning
        assert effects.count("charge") == 1


def outcome_writes(statement: str, parameters: Any) -> bool:
    """The operation ledger's record of a call's outcome (the UPDATE after `started`)."""
    return (
        bool(writes_to("operations")(statement, parameters))
        and statement.lstrip().upper()[:6] == "UPDATE"
    )


async def ledger_status(database_url: str, call_id: str) -> list[tuple[Any, ...]]:
    query = "SELECT status, result FROM operations WHERE call_id = ?"
    return await rows(database_url, query, call_id)


async def test_a_side_effect_whose_outcome_cannot_be_stored_still_reports_its_output(
    database_url: str,
) -> None:
    """The lookup's side effect happens, then the ledger's record of its outcome fails. The
    model and the client still get the tool's real output (before, the failed record made the
    tool raise, and the model was told a side effect that had happened had failed); the run
    goes on, and the outcome is stored once storage is back."""
    effects = EffectLog()
    async with (
        faulty_gateway(settings_for(database_url), charger_registry(effects)) as fg,
        clients(fg.gateway) as connect,
    ):
        faults = fg.faults
        alice = await connect("alice", "user")
        faults.fail(outcome_writes)
        ack = await alice.request("run.start", input="charge order 5", agent=AGENT)
        output = await alice.wait_event("tool.output", call_id="call_lookup_1")
        assert output["data"]["output"] == 'lookup done with {"value": "order 5"}'
        await faults.wait_hits(1)
        assert await ledger_status(database_url, "call_lookup_1") == [("started", None)]
        await asyncio.sleep(0.3)
        faults.heal()
        await alice.wait_event("approval.requested")

        async def ledger_done() -> bool:
            found = await ledger_status(database_url, "call_lookup_1")
            return found == [("done", output["data"]["output"])]

        deadline = time.monotonic() + 10
        while not await ledger_done():
            assert time.monotonic() < deadline, await ledger_status(database_url, "call_lookup_1")
            await asyncio.sleep(0.05)
        assert effects.count("lookup") == 1
        assert "run.failed" not in names(alice.events_of(ack["thread_id"]))


async def test_a_side_effects_outcome_is_stored_before_its_output_is_seen(
    database_url: str,
) -> None:
    """The outcome is not waited for by the tool, but is queued ahead of the tool's output:
    a client that has the output finds the ledger's record of it."""
    effects = EffectLog()
    async with running_gateway(settings_for(database_url), charger_registry(effects)) as gw:
        async with clients(gw) as connect:
            alice = await connect("alice", "user")
            await alice.request("run.start", input="charge order 5", agent=AGENT)
            output = await alice.wait_event("tool.output", call_id="call_lookup_1")
            assert await ledger_status(database_url, "call_lookup_1") == [
                ("done", output["data"]["output"])
            ]


# -- 2. the decision cannot be recorded ----------------------------------------------------


# The decision's own writes, or the last writes of its transaction: the run's claim to continue
# (`resuming`), made there once nothing is left pending, and the continuation's start (the
# run's lease, `running`), made there too. Either way the whole decision is undone.
@pytest.mark.parametrize(
    "failing",
    [writes_to("approvals", "events"), writes_to("runs"), lease_takes],
    ids=["decision-writes", "continuation-claim", "continuation-start"],
)
async def test_decision_during_storage_failure_is_unavailable_and_changes_nothing(
    database_url: str, failing: Predicate
) -> None:
    effects = EffectLog()
    async with (
        faulty_gateway(settings_for(database_url), charger_registry(effects)) as fg,
        clients(fg.gateway) as connect,
    ):
        gw, faults = fg.gateway, fg.faults
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        await bob.request("inbox.subscribe")
        ack = await alice.request("run.start", input="charge order 5", agent=AGENT)
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        requested = await alice.wait_event("approval.requested")
        approval_id = requested["data"]["approval_id"]
        await alice.wait_event("run.paused")
        await bob.wait_for(lambda f: approval_id in inbox_added(bob))
        head_before = await stored_events(database_url, thread_id)

        faults.fail(failing)
        with pytest.raises(ProtocolFailure) as failure:
            await bob.request("approval.decide", approval_id=approval_id, decision="approve")
        assert failure.value.code == "unavailable"
        assert failure.value.frame["ref"]
        async with gw.http() as http:
            response = await http.post(
                f"/v1/approvals/{approval_id}/decision",
                headers={"authorization": f"Bearer {gw.token('carol', 'reviewer')}"},
                json={"decision": "reject", "reason": "not now"},
            )
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "unavailable"
        assert faults.hits >= 2

        # Nothing changed: still pending, no decision event, the run still waits for review.
        await asyncio.sleep(0.3)
        pending = await pending_approvals(gw)
        assert [(a["approval_id"], a["status"]) for a in pending] == [(approval_id, "pending")]
        view = await run_view(gw, run_id)
        assert view["status"] == "waiting_for_review"
        assert [a["approval_id"] for a in view["pending_approvals"]] == [approval_id]
        assert "approval.decided" not in names(alice.events_of(thread_id))
        assert inbox_removed(bob) == []
        assert await stored_events(database_url, thread_id) == head_before
        assert await rows(
            database_url,
            "SELECT status, reviewer FROM approvals WHERE approval_id = ?",
            approval_id,
        ) == [("pending", None)]
        assert effects.count("charge") == 0

        faults.heal()
        ack = await bob.request("approval.decide", approval_id=approval_id, decision="approve")
        assert ack["approval"]["status"] == "approved"
        assert ack["approval"]["reviewer"] == "bob"
        await alice.wait_event("run.completed", timeout=10)

        events = alice.events_of(thread_id)
        seen = names(events)
        decided = [e for e in events if e["event"] == "approval.decided"]
        assert len(decided) == 1
        assert decided[0]["data"]["reviewer"] == "bob"
        assert decided[0]["data"]["decision"] == "approve"
        assert seen.count("run.resumed") == 1
        assert FINAL in final_text(events, run_id)
        assert_dense(events)
        assert effects.count("charge") == 1
        await bob.wait_for(lambda f: approval_id in inbox_removed(bob))


async def test_continuation_after_recorded_decision_survives_storage_blip(
    database_url: str,
) -> None:
    """The decision is stored (with the run's claim to continue, `resuming`), then the
    continuation's own first write (taking the run's lease, in the transaction that logs
    `run.resumed`) fails. Input staged on the paused run makes the continuation a transaction
    of its own (the SDK may refuse the input, so it is applied before anything is stored);
    without it the decision's transaction starts the continuation as well, and a failure
    there undoes the decision (the `continuation-start` case above).

    The reviewer already has an `approved` ack and the pause has no pending approval left, so
    no further decision will come: once storage is back the gateway itself must continue the
    run (a short lease TTL gives its periodic recovery every chance to do so)."""
    effects = EffectLog()
    async with (
        faulty_gateway(
            settings_for(database_url, lease_ttl_s=2.0), charger_registry(effects)
        ) as fg,
        clients(fg.gateway) as connect,
    ):
        gw, faults = fg.gateway, fg.faults
        alice = await connect("alice", "user")
        bob = await connect("bob", "reviewer")
        ack = await alice.request("run.start", input="charge order 5", agent=AGENT)
        thread_id, run_id = ack["thread_id"], ack["run_id"]
        requested = await alice.wait_event("approval.requested")
        approval_id = requested["data"]["approval_id"]
        await alice.wait_event("run.paused")
        staged = await alice.request("run.input", thread_id=thread_id, input="thanks")
        assert staged["disposition"] == "staged"

        faults.fail(lease_takes)  # the decision's own writes still go through
        decided = await bob.request("approval.decide", approval_id=approval_id, decision="approve")
        assert decided["approval"]["status"] == "approved"
        await faults.wait_hits(1)
        await asyncio.sleep(0.3)
        faults.heal()

        await alice.wait_event("run.completed", timeout=10)
        events = alice.events_of(thread_id)
        seen = names(events)
        assert seen.count("approval.decided") == 1
        assert seen.count("run.resumed") == 1
        assert seen.index("approval.decided") < seen.index("run.resumed")
        assert FINAL in final_text(events, run_id)
        assert_dense(events)
        assert effects.count("charge") == 1
        assert (await run_view(gw, run_id))["status"] == "completed"


# -- 3. readiness ----------------------------------------------------------------------------


async def ready_again(http: httpx.AsyncClient, timeout: float = 10) -> httpx.Response:
    """`/readyz` once storage health's next probe has found storage back."""
    deadline = time.monotonic() + timeout
    while True:
        response = await http.get("/readyz")
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        await asyncio.sleep(0.05)


def event_reads(statement: str, parameters: Any) -> bool:
    """Reads of the event log (a subscription's replay)."""
    text = " ".join(statement.split()).upper()
    return text.startswith("SELECT") and " FROM EVENTS" in text


async def test_a_thread_feed_that_cannot_read_the_log_ends_at_once_with_its_last_word(
    database_url: str,
) -> None:
    """docs/protocol.md §8: when the server cannot read the log it ends the feed, with
    `event: end` naming the WebSocket's code of the same case (1011), at once rather than at
    the next heartbeat; the client resumes from its Last-Event-ID."""
    settings = settings_for(database_url, heartbeat_s=30.0)
    async with faulty_gateway(settings) as fg, clients(fg.gateway) as connect:
        gw, faults = fg.gateway, fg.faults
        alice = await connect("alice", "user")
        ack = await alice.request("run.start", input="hello")
        await alice.wait_event("run.completed")
        faults.fail(event_reads)
        headers = {"Authorization": f"Bearer {gw.token('alice')}"}
        opened = time.monotonic()
        async with (
            gw.http() as http,
            http.stream("GET", f"/v1/threads/{ack['thread_id']}/stream", headers=headers) as feed,
        ):
            assert feed.status_code == 200
            body = (await asyncio.wait_for(feed.aread(), 10)).decode()
        took = time.monotonic() - opened
    assert faults.hits >= 1
    assert took < 5, took  # not the 30 s heartbeat
    messages = [m for m in body.split("\n\n") if m.strip()]
    assert messages[0].splitlines()[-2] == "event: subscribed"
    assert messages[-1].startswith("event: end\ndata: "), messages[-1]
    end = orjson.loads(messages[-1].split("data: ", 1)[1])
    assert end == {
        "type": "end",
        "code": 1011,
        "message": "the thread's log could not be read: reconnect to resume",
    }


async def test_readyz_follows_storage(database_url: str) -> None:
    settings = settings_for(database_url, storage_probe_s=PROBE_S)
    async with faulty_gateway(settings, charger_registry(EffectLog())) as fg:
        gw, faults = fg.gateway, fg.faults
        async with gw.http() as http:
            assert (await http.get("/readyz")).status_code == 200

            faults.fail(select_one)
            response = await http.get("/readyz")
            assert response.status_code == 503
            assert response.json()["status"] == "unavailable"
            assert (await http.get("/healthz")).status_code == 200  # alive, just not ready

            faults.heal()
            response = await ready_again(http)
            assert response.status_code == 200
            assert response.json() == {"status": "ready", "storage": "ok"}


async def test_whole_database_down_answers_unavailable_then_recovers(database_url: str) -> None:
    """Every statement fails: readiness is 503 and writes answer `unavailable`; then it heals."""
    effects = EffectLog()
    async with (
        faulty_gateway(
            settings_for(database_url, storage_probe_s=PROBE_S), charger_registry(effects)
        ) as fg,
        clients(fg.gateway) as connect,
    ):
        gw, faults = fg.gateway, fg.faults
        alice = await connect("alice", "user")

        faults.fail(every_statement)
        async with gw.http() as http:
            assert (await http.get("/readyz")).status_code == 503
        with pytest.raises(ProtocolFailure) as failure:
            await alice.request("run.start", input="charge order 5", agent=AGENT)
        assert failure.value.code == "unavailable"
        assert await rows(database_url, "SELECT count(*) FROM runs") == [(0,)]

        faults.heal()
        async with gw.http() as http:
            assert (await ready_again(http)).status_code == 200
        ack = await alice.request("run.start", input="charge order 5", agent=AGENT)
        await alice.wait_event("run.paused", timeout=10)
        events = alice.events_of(ack["thread_id"])
        assert events[0]["event"] == "run.started"
        assert_dense(events)
        assert effects.count("lookup") == 1
