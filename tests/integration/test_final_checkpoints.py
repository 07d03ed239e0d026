"""A run's last state is checkpointed when it ends: at completion and after an error.

Both are consistent points of the SDK's state. The checkpoint is written in the transaction that
ends the run, versioned after every earlier one (which it replaces), and restores against the
same graph — so an operator can inspect what the agent had done when it failed. A terminal run
is never resumed from it (docs/architecture.md "Invariants", 4).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from agents import RunState
from agents.testing import ModelStep

from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.run_lifecycle.execution import ELIDED_HISTORY_KEY
from tests.support.agents import EffectLog, call, say, scripted_graph
from tests.support.client import clients


def checkpoint_rows(db_path: Path, run_id: str) -> list[tuple[int, str, str]]:
    with sqlite3.connect(db_path) as db:
        return db.execute(
            "SELECT version, reason, state FROM checkpoints WHERE run_id = ? ORDER BY version",
            (run_id,),
        ).fetchall()


def run_row(db_path: Path, run_id: str) -> tuple[str, int]:
    with sqlite3.connect(db_path) as db:
        row = db.execute(
            "SELECT status, checkpoint_version FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
    return row[0], row[1]


def one_graph(graph: AgentGraph) -> AgentRegistry:
    return AgentRegistry([graph], default=graph.name)


def overrunner(effects: EffectLog, *first_turn: Any) -> AgentGraph:
    """max_turns=1 and a model that wants a second turn: MaxTurnsExceeded after turn one, in
    which `first_turn` is said before a lookup runs."""
    graph, _ = scripted_graph(
        "overrunner",
        [
            ModelStep(output=[*first_turn, call("lookup", "call_lookup_1", value="1")]),
            ModelStep(output=[say("never reached")]),
        ],
        effects,
    )
    return AgentGraph(name=graph.name, version=graph.version, build=graph.build, max_turns=1)


async def run_until(
    gateway_factory: Any, registry: AgentRegistry, text: str, end: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Alice starts a run with `text` on a fresh gateway: its ack, and the `end` event."""
    async with gateway_factory(registry) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        ack = await alice.request("run.start", input=text)
        return ack, await alice.wait_event(end)


async def test_completed_run_keeps_its_final_state(gateway_factory: Any, db_path: Path) -> None:
    effects = EffectLog()
    graph, _ = scripted_graph(
        "finisher",
        [
            ModelStep(output=[say("looking"), call("lookup", "call_lookup_1", value="7")]),
            ModelStep(output=[say("order 7 is fine")]),
        ],
        effects,
    )
    ack, _ = await run_until(gateway_factory, one_graph(graph), "check order 7", "run.completed")
    run_id = ack["run_id"]

    rows = checkpoint_rows(db_path, run_id)
    # The turn's checkpoint (version 1) went when the final one was stored.
    assert [(version, reason) for version, reason, _ in rows] == [(2, "completed")]
    assert run_row(db_path, run_id) == ("completed", 2)
    state: RunState[Any, Any] = await RunState.from_string(graph.build(), rows[-1][2])
    assert state._current_turn == 2
    assert "order 7 is fine" in str(state._model_responses[-1].output)


async def test_failed_run_keeps_the_state_it_failed_in(gateway_factory: Any, db_path: Path) -> None:
    effects = EffectLog()
    graph = overrunner(effects, say("first turn"))
    ack, failed = await run_until(gateway_factory, one_graph(graph), "look it up", "run.failed")
    run_id = ack["run_id"]
    assert failed["data"]["error"]["code"] == "max_turns"

    rows = checkpoint_rows(db_path, run_id)
    # The state it failed in, and its last turn boundary before it (where a retry goes on
    # from, docs/protocol.md §4 `run.retry`); older turns' checkpoints were pruned.
    assert [reason for _, reason, _ in rows] == ["turn", "error"]
    status, version = run_row(db_path, run_id)
    assert (status, version) == ("failed", rows[-1][0])
    # The error checkpoint holds the turn that did happen: the lookup and its output.
    state: RunState[Any, Any] = await RunState.from_string(graph.build(), rows[-1][2])
    assert "call_lookup_1" in rows[-1][2]
    assert state._current_turn >= 1
    assert effects.count("lookup") == 1


async def test_a_failed_run_is_not_resumed_from_its_error_checkpoint(
    gateway_factory: Any, db_path: Path
) -> None:
    effects = EffectLog()
    registry = one_graph(overrunner(effects))
    ack, _ = await run_until(gateway_factory, registry, "look it up", "run.failed")
    head_before = checkpoint_rows(db_path, ack["run_id"])
    # A restart recovers active runs only: the failed run stays failed, nothing re-runs.
    async with gateway_factory(registry) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        await alice.request("thread.subscribe", thread_id=ack["thread_id"], after_seq=0)
        await alice.wait_event("run.failed")
        await alice.request("ping")
        assert "run.recovered" not in [e["event"] for e in alice.events]
    assert checkpoint_rows(db_path, ack["run_id"]) == head_before
    assert run_row(db_path, ack["run_id"])[0] == "failed"
    assert effects.count("lookup") == 1


async def test_a_final_state_leaves_the_threads_history_to_the_session(
    gateway_factory: Any, db_path: Path
) -> None:
    """The second run of a thread keeps only its own input in its final state (the history
    before it is the session's, counted in `gateway_elided_history_items`), and still
    restores."""
    graph, _ = scripted_graph(
        "talker",
        [ModelStep(output=[say("first answer")]), ModelStep(output=[say("again")])],
        EffectLog(),
    )
    async with gateway_factory(one_graph(graph)) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        first = await alice.request("run.start", input="hello there")
        await alice.wait_event("run.completed")
        second = await alice.request(
            "run.input", thread_id=first["thread_id"], input="and once more"
        )
        await alice.wait_for(
            lambda f: f.get("event") == "run.completed" and f.get("run_id") == second["run_id"]
        )
    ((_, reason, state_json),) = checkpoint_rows(db_path, second["run_id"])
    assert reason == "completed"
    data = json.loads(state_json)
    assert [item.get("content") for item in data["original_input"]] == ["and once more"]
    # The first run's input and answer: the session's items before the second run.
    assert data[ELIDED_HISTORY_KEY] == 2
    assert "hello there" not in state_json
    state: RunState[Any, Any] = await RunState.from_string(graph.build(), state_json)
    assert "again" in str(state._model_responses[-1].output)


async def test_a_cancelled_run_keeps_no_checkpoint(gateway_factory: Any, db_path: Path) -> None:
    effects = EffectLog()
    graph, _ = scripted_graph(
        "pauser", [ModelStep(output=[call("charge", "call_charge_1", value="5")])], effects
    )
    async with gateway_factory(one_graph(graph)) as gw, clients(gw) as open_client:
        alice = await open_client("alice", "user")
        ack = await alice.request("run.start", input="charge it")
        await alice.wait_event("run.paused")
        assert [reason for _, reason, _ in checkpoint_rows(db_path, ack["run_id"])] == ["approval"]
        await alice.request("run.cancel", run_id=ack["run_id"])
        await alice.wait_event("run.cancelled")
    assert checkpoint_rows(db_path, ack["run_id"]) == []
    assert run_row(db_path, ack["run_id"])[0] == "cancelled"
