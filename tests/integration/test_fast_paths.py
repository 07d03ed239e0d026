"""The run lifecycle's fast paths, end to end: a run start delivered without reading anything
back, one restore per pause shared by its decisions and continuation, a single continuation
started from what the deciding transactions read, decisions applied as the continuation's
segment starts, the session mark of a pause read where it is stored, and a statement observer
on the store's engines (as SQL tracing or the tests' storage faults install) seeing every write
of the lifecycle while changing nothing of it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from agents.run_state import RunState
from sqlalchemy import event

from gateway.agents.registry import AgentRegistry
from gateway.run_lifecycle.execution import approval_view
from persistence.approvals import ApprovalRepository, ApprovalStatus
from persistence.backends import open_store
from persistence.sessions import GatewaySession
from tests.support.agents import EffectLog
from tests.support.approvals import http_decide, requester_and_reviewer
from tests.support.client import Client, clients, final_text
from tests.support.faults import faulty_gateway
from tests.support.gated import gated_graph
from tests.support.gateway import test_settings as settings_for
from tests.support.sqlite_file import sql
from tests.support.storage import observed


def registry(effects: EffectLog, calls: int = 1) -> AgentRegistry:
    graph = gated_graph(effects, calls=calls)
    return AgentRegistry([graph], default=graph.name)


async def pause(client: Client, text: str, thread_id: str | None = None) -> dict[str, Any]:
    """Start a run (on a new thread unless given) and wait until it pauses; its ack."""
    fields = {"input": text} | ({"thread_id": thread_id} if thread_id else {})
    ack = await client.request("run.start", **fields)
    await client.wait_for(
        lambda f: f.get("event") == "run.paused" and f.get("run_id") == ack["run_id"]
    )
    return ack


def requested(client: Client, run_id: str) -> list[dict[str, Any]]:
    return [
        e["data"]
        for e in client.events
        if e["event"] == "approval.requested" and e["run_id"] == run_id
    ]


async def completed(client: Client, run_id: str) -> None:
    await client.wait_for(lambda f: f.get("event") == "run.completed" and f.get("run_id") == run_id)


def kinds(client: Client, thread_id: str) -> list[str]:
    # Deltas merge by timing; every other event is the same on any path.
    return [e["event"] for e in client.events_of(thread_id) if e["event"] != "message.delta"]


class Restores:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = RunState.from_string

        async def counting(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await original(*args, **kwargs)

        monkeypatch.setattr(RunState, "from_string", counting)


async def test_a_run_start_answers_ack_subscribed_then_its_first_event(
    gateway_factory: Any,
) -> None:
    async with gateway_factory(registry(EffectLog())) as gw, clients(gw) as connect:
        alice = await connect("alice", "user")
        ack = await alice.request("run.start", input="pay 1")
        await alice.wait_event("run.started")
        frames = [f for f in alice.frames if f.get("type") in ("ack", "subscribed", "event")]
        assert [f["type"] for f in frames[:3]] == ["ack", "subscribed", "event"]
        subscribed, started = frames[1], frames[2]
        assert subscribed["thread_id"] == ack["thread_id"]
        assert started["event"] == "run.started" and started["seq"] == 1
        assert subscribed["head_seq"] == started["seq"]
        # The epoch announced is the thread's own.
        epoch = sql(gw_db(gw), "SELECT epoch FROM threads WHERE thread_id = ?", (ack["thread_id"],))
        assert subscribed["epoch"] == epoch[0][0]


@pytest.mark.both_backends
async def test_a_run_start_on_a_new_thread_reads_nothing_of_its_log_or_history(
    database_url: str,
) -> None:
    """The caller of a run that created its thread is subscribed from the run's first commit,
    which is all the thread has: the subscription goes live without reading the log, and
    still gets every event, in order, as a subscriber reading from the cursor does. The
    thread's session is known to be empty: the SDK's read of its history is answered without
    reading it, and the run's items are stored as always. The log watch polls meanwhile
    (every 10 ms here): it finds this process's own commits, some before their events are
    published, and has nothing to wake the subscription for."""
    settings = settings_for(database_url, log_watch_interval_s=0.01)
    async with (
        faulty_gateway(settings, registry(EffectLog())) as fg,
        clients(fg.gateway) as connect,
    ):
        alice, carol = await connect("alice", "user"), await connect("carol", "reviewer")
        pages: list[str] = []

        def observe(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if "FROM events" in statement and "events.seq >" in statement:
                pages.append(statement)
            if statement.startswith("SELECT agent_messages.message_data"):
                pages.append(statement)

        engines = list(fg.services.store.statement_engines())
        for engine in engines:
            event.listen(engine, "before_cursor_execute", observe)
        try:
            ack = await pause(alice, "pay 7")
            await asyncio.sleep(0.1)
        finally:
            for engine in engines:
                event.remove(engine, "before_cursor_execute", observe)
        assert pages == []
        seen = [(e["seq"], e["event"]) for e in alice.events_of(ack["thread_id"])]
        # The same thread read from its start by another subscriber.
        await carol.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
        await carol.wait_for(lambda f: f.get("event") == "run.paused")
        assert [(e["seq"], e["event"]) for e in carol.events_of(ack["thread_id"])] == seen
        assert [seq for seq, _ in seen] == list(range(1, len(seen) + 1))
        history = await GatewaySession(ack["thread_id"], store=fg.services.store).get_items()
        assert [item.get("content") for item in history][:1] == ["pay 7"]


def gw_db(gw: Any) -> Path:
    return Path(gw.settings.database_url.split("///", 1)[1])


async def test_a_pause_is_restored_once_for_all_its_decisions_and_its_continuation(
    gateway_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    restores = Restores(monkeypatch)
    effects = EffectLog()
    async with requester_and_reviewer(gateway_factory, registry(effects, calls=2)) as (
        _,
        alice,
        bob,
    ):
        ack = await pause(alice, "pay twice")
        first, second = requested(alice, ack["run_id"])
        await bob.request("approval.decide", approval_id=first["approval_id"], decision="approve")
        await bob.request("approval.decide", approval_id=second["approval_id"], decision="reject")
        await completed(alice, ack["run_id"])
    assert restores.count == 1
    assert effects.count("charge") == 1


async def test_concurrent_last_decisions_continue_the_run_exactly_once(
    gateway_factory: Any,
) -> None:
    effects = EffectLog()
    async with requester_and_reviewer(gateway_factory, registry(effects, calls=2)) as (
        gw,
        alice,
        bob,
    ):
        ack = await pause(alice, "pay twice")
        first, second = requested(alice, ack["run_id"])
        token = gw.token("carol", "reviewer")
        ws, http = await asyncio.gather(
            bob.request("approval.decide", approval_id=first["approval_id"], decision="approve"),
            http_decide(gw, token, second["approval_id"]),
        )
        assert ws["approval"]["status"] == "approved" and http.status_code == 200
        await completed(alice, ack["run_id"])
        names = kinds(alice, ack["thread_id"])
        assert names.count("run.resumed") == 1
        assert names.count("approval.decided") == 2
        assert effects.count("charge") == 2
        seqs = [e["seq"] for e in alice.events_of(ack["thread_id"])]
        assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.both_backends
async def test_the_last_decision_starts_the_continuation_in_its_own_transaction(
    database_url: str,
) -> None:
    """The decision that leaves nothing pending stores `approval.decided` and `run.resumed`
    in one statement of one transaction (it took the lease and moved the run to `running`
    there); an earlier decision of the same pause stores only its own. With input staged on
    the paused run the continuation is a transaction of its own (the input is applied before
    anything is stored), and the run goes on alike: one `run.resumed`, the approved call run
    once."""
    effects = EffectLog()
    async with (
        faulty_gateway(settings_for(database_url), registry(effects, calls=2)) as fg,
        clients(fg.gateway) as connect,
    ):
        alice, bob = await connect("alice", "user"), await connect("bob", "reviewer")
        inserts: list[str] = []

        def observe(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            if "INSERT INTO events" in statement:
                inserts.append(repr(parameters))

        engines = list(fg.services.store.statement_engines())
        for engine in engines:
            event.listen(engine, "before_cursor_execute", observe)
        try:
            for staged in (False, True):
                ack = await pause(alice, f"pay twice, staged {staged}")
                first, second = requested(alice, ack["run_id"])
                if staged:
                    sent = await alice.request(
                        "run.input", thread_id=ack["thread_id"], input="thanks"
                    )
                    assert sent["disposition"] == "staged"
                inserts.clear()
                await bob.request(
                    "approval.decide", approval_id=first["approval_id"], decision="approve"
                )
                (alone,) = inserts
                assert "approval.decided" in alone and "run.resumed" not in alone
                await bob.request(
                    "approval.decide", approval_id=second["approval_id"], decision="reject"
                )
                # The staged input is a new turn of the gated model: the run pauses again.
                settled = "run.paused" if staged else "run.completed"
                paused_at = max(e["seq"] for e in alice.events_of(ack["thread_id"]))
                await alice.wait_for(
                    lambda f, s=settled, a=paused_at: f.get("event") == s and f["seq"] > a
                )
                (resumed,) = [i for i in inserts if "run.resumed" in i]
                assert ("approval.decided" in resumed) is not staged
                names = kinds(alice, ack["thread_id"])
                assert names.count("run.resumed") == 1
                at = names.index("run.resumed")
                assert names[at - 1] == "approval.decided"
        finally:
            for engine in engines:
                event.remove(engine, "before_cursor_execute", observe)
    assert effects.count("charge") == 2
    assert fg.faults.hits == 0


@pytest.mark.both_backends
async def test_the_last_decisions_transaction_leaves_nothing_of_another_attempt_behind(
    database_url: str,
) -> None:
    """The last decision's transaction claims the continuation, takes the run's lease and
    moves it to `running` in one statement: the run is never stored `resuming`; whether input
    is staged is read with the pause's approvals. It still does
    all a continuation does: a pending approval of another checkpoint of the run (a pause
    left behind) is superseded, and history written after the pause's session mark (by a
    process that lost the run) is trimmed, before the continuation's model turn reads it."""
    effects = EffectLog()
    async with (
        faulty_gateway(settings_for(database_url), registry(effects)) as fg,
        clients(fg.gateway) as connect,
    ):
        alice, bob = await connect("alice", "user"), await connect("bob", "reviewer")
        ack = await pause(alice, "pay 3")
        (request,) = requested(alice, ack["run_id"])
        store = fg.services.store
        approvals = ApprovalRepository(store)
        mine = await approvals.get(request["approval_id"])
        assert mine is not None
        left = replace(
            mine,
            approval_id="ap_left_behind",
            checkpoint_version=mine.checkpoint_version - 1,
            call_id="call_left_behind",
        )
        await store.write(lambda conn: ApprovalRepository.insert_in(conn, [left]))
        session = GatewaySession(ack["thread_id"], store=store)
        await session.add_items([{"role": "assistant", "content": "from a lost attempt"}])
        runs: list[str] = []
        inputs: list[str] = []

        def observe(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            if "UPDATE runs" in statement:
                runs.append(f"{statement} {parameters!r}")
            # A run's staged input (its thread's queued input is read when it ends).
            if "pending_inputs.run_id" in statement and "approvals" not in statement:
                inputs.append(statement)

        engines = list(store.statement_engines())
        for engine in engines:
            event.listen(engine, "before_cursor_execute", observe)
        try:
            await bob.request(
                "approval.decide", approval_id=request["approval_id"], decision="approve"
            )
        finally:
            for engine in engines:
                event.remove(engine, "before_cursor_execute", observe)
        (taken,) = runs
        assert "running" in taken and "resuming" not in taken
        # Whether input is staged came with the pause's approvals: nothing else was read.
        assert inputs == []
        await completed(alice, ack["run_id"])
        superseded = await approvals.get("ap_left_behind")
        assert superseded is not None and superseded.status is ApprovalStatus.SUPERSEDED
        history = [item.get("content") for item in await session.get_items()]
        assert "from a lost attempt" not in history and history[0] == "pay 3"
    assert effects.count("charge") == 1


@pytest.mark.both_backends
async def test_a_decision_reads_its_approval_once_where_it_was_requested(
    database_url: str,
) -> None:
    """The process that requested an approval knows its thread: a decision on it takes the
    thread's lock at once and reads the approval only under it. Another process (here the
    gateway started again on the same database) reads it first to find the thread, and again
    under the lock; the decision is the same."""
    effects = EffectLog()

    def approval_reads(statements: list[str]) -> int:
        return sum(
            s.startswith("SELECT approvals.approval_id AS a_approval_id") for s in statements
        )

    async with (
        faulty_gateway(settings_for(database_url), registry(effects, calls=2)) as fg,
        clients(fg.gateway) as connect,
    ):
        alice, bob = await connect("alice", "user"), await connect("bob", "reviewer")
        ack = await pause(alice, "pay twice")
        first, second = requested(alice, ack["run_id"])
        with observed(fg.services.store) as statements:
            await bob.request(
                "approval.decide", approval_id=first["approval_id"], decision="approve"
            )
        assert approval_reads(statements) == 1
    async with (
        faulty_gateway(settings_for(database_url), registry(effects, calls=2)) as fg,
        clients(fg.gateway) as connect,
    ):
        alice, bob = await connect("alice", "user"), await connect("bob", "reviewer")
        await alice.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
        with observed(fg.services.store) as statements:
            decided = await bob.request(
                "approval.decide", approval_id=second["approval_id"], decision="reject"
            )
        assert approval_reads(statements) == 2
        assert decided["approval"]["status"] == "rejected"
        await completed(alice, ack["run_id"])
    assert effects.count("charge") == 1


async def test_the_decision_ack_shows_the_row_as_stored(
    gateway_factory: Any, db_path: Path
) -> None:
    async with requester_and_reviewer(gateway_factory, registry(EffectLog())) as (_, alice, bob):
        ack = await pause(alice, "pay 3")
        (shown,) = requested(alice, ack["run_id"])
        decided = await bob.request(
            "approval.decide", approval_id=shown["approval_id"], decision="reject", reason="no"
        )
    store = open_store(f"sqlite:///{db_path}")
    try:
        stored = await ApprovalRepository(store).get(shown["approval_id"])
    finally:
        await store.close()
    assert stored is not None
    assert decided["approval"] == approval_view(stored)
    assert (stored.status.value, stored.reviewer, stored.reason) == ("rejected", "bob", "no")


async def test_a_pause_stores_the_session_mark_it_was_taken_at(
    gateway_factory: Any, db_path: Path
) -> None:
    async with requester_and_reviewer(gateway_factory, registry(EffectLog())) as (_, alice, bob):
        first = await pause(alice, "pay 1")
        (shown,) = requested(alice, first["run_id"])
        await bob.request("approval.decide", approval_id=shown["approval_id"], decision="approve")
        await completed(alice, first["run_id"])
        history = sql(db_path, "SELECT COUNT(*) FROM agent_messages")[0][0]

        second = await pause(alice, "pay 2", thread_id=first["thread_id"])
        mark = sql(
            db_path,
            "SELECT session_mark FROM checkpoints WHERE run_id = ? AND reason = 'approval'",
            (second["run_id"],),
        )[0][0]
        head = sql(
            db_path,
            "SELECT MAX(id) FROM agent_messages WHERE session_id = ?",
            (first["thread_id"],),
        )[0][0]
        assert mark == head > 0
        (shown,) = requested(alice, second["run_id"])
        await bob.request("approval.decide", approval_id=shown["approval_id"], decision="approve")
        await completed(alice, second["run_id"])
        # The continuation trimmed nothing: the first run's history is all still there.
        assert sql(db_path, "SELECT COUNT(*) FROM agent_messages")[0][0] > history


async def test_a_statement_observer_sees_the_lifecycle_and_changes_nothing_of_it(
    gateway_factory: Any, db_path: Path, tmp_path: Path
) -> None:
    """With a statement observer installed on the store's engines (as SQL tracing or the
    tests' storage faults do), it sees every write of the lifecycle, and the runs look the same
    to their client and leave the same rows as without one."""

    async def lifecycle(alice: Client, bob: Client) -> tuple[list[str], str]:
        ack = await pause(alice, "pay 5")
        (shown,) = requested(alice, ack["run_id"])
        await bob.request("approval.decide", approval_id=shown["approval_id"], decision="approve")
        await completed(alice, ack["run_id"])
        again = await pause(alice, "pay 6", thread_id=ack["thread_id"])
        (shown,) = requested(alice, again["run_id"])
        await bob.request("approval.decide", approval_id=shown["approval_id"], decision="reject")
        await completed(alice, again["run_id"])
        return kinds(alice, ack["thread_id"]), final_text(alice.events, again["run_id"])

    effects = EffectLog()
    async with requester_and_reviewer(gateway_factory, registry(effects)) as (_, alice, bob):
        unobserved = await lifecycle(alice, bob)

    observed = tmp_path / "observed.db"
    async with (
        faulty_gateway(settings_for(observed), registry(effects)) as fg,
        clients(fg.gateway) as connect,
    ):
        statements: list[str] = []

        def observe(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            statements.append(statement)

        engines = list(fg.services.store.statement_engines())
        for engine in engines:
            event.listen(engine, "before_cursor_execute", observe)
        try:
            alice, bob = await connect("alice", "user"), await connect("bob", "reviewer")
            assert await lifecycle(alice, bob) == unobserved
        finally:
            for engine in engines:
                event.remove(engine, "before_cursor_execute", observe)
        assert fg.faults.hits == 0  # observed, never failed
    for written in (
        "INSERT INTO events",
        "INSERT INTO checkpoints",
        "INSERT INTO approvals",
        "INSERT INTO agent_messages",
    ):
        assert any(s.startswith(written) for s in statements), written
    tables = "SELECT COUNT(*) FROM {} "
    for table in ("runs", "checkpoints", "approvals", "events", "audit", "agent_messages"):
        assert sql(observed, tables.format(table)) == sql(db_path, tables.format(table)), table
    assert effects.count("charge") == 2


async def test_decisions_the_sdk_refuses_after_the_resume_fail_the_run(
    gateway_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decisions are applied as the continuation's segment starts, after `run.resumed` is
    stored: should the SDK refuse one there, the run fails like any run that raises (it is
    never left running without a segment)."""

    def refuse(self: RunState[Any, Any], *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("cannot approve")

    effects = EffectLog()
    async with requester_and_reviewer(gateway_factory, registry(effects)) as (gw, alice, bob):
        ack = await pause(alice, "pay 7")
        (shown,) = requested(alice, ack["run_id"])
        monkeypatch.setattr(RunState, "approve", refuse)
        await bob.request("approval.decide", approval_id=shown["approval_id"], decision="approve")
        failed = await alice.wait_for(
            lambda f: f.get("event") == "run.failed" and f.get("run_id") == ack["run_id"]
        )
        assert "cannot approve" in failed["data"]["error"]["message"]
        names = kinds(alice, ack["thread_id"])
        assert names[names.index("approval.decided") :] == [
            "approval.decided",
            "run.resumed",
            "run.failed",
        ]
        async with gw.http() as http:
            view = await http.get(
                f"/v1/runs/{ack['run_id']}",
                headers={"Authorization": f"Bearer {gw.token('alice', 'user')}"},
            )
        assert view.json()["run"]["status"] == "failed"
    assert effects.count("charge") == 0
