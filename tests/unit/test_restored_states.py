"""`RestoredStates` (gateway/run_lifecycle/restored_checkpoints.py): a pause's checkpoint is
restored once, looked at by the binding checks and taken by the continuation; anything not prepared
is restored from the stored row, as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from agents import RunConfig, Runner
from agents.run_state import CURRENT_SCHEMA_VERSION, RunState

from gateway.agents.demo.assistant import OfflineModelProvider, build_demo_agent
from gateway.agents.registry import AgentGraph
from gateway.run_lifecycle.restored_checkpoints import RestoredStates
from persistence.checkpoints import CheckpointRecord

GRAPH = AgentGraph(name="assistant", version="1", build=build_demo_agent)


@pytest.fixture(scope="module")
def paused_state() -> str:
    """The JSON of a demo run paused for a refund approval, as the gateway stores it."""

    async def pause() -> str:
        result = Runner.run_streamed(
            build_demo_agent(),
            "refund order 42 for 30",
            run_config=RunConfig(model_provider=OfflineModelProvider(0), tracing_disabled=True),
        )
        async for _ in result.stream_events():
            pass
        assert result.interruptions
        return orjson.dumps(result.to_state().to_json()).decode()

    return asyncio.run(pause())


def checkpoint(state: str, run_id: str = "r_1", version: int = 1) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=run_id,
        version=version,
        state=state,
        sdk_schema_version=CURRENT_SCHEMA_VERSION,
        graph_name=GRAPH.name,
        graph_version=GRAPH.version,
        reason="approval",
        session_mark=7,
        created_at=datetime(2026, 11, 29, tzinfo=UTC),
    )


class Restores:
    """Counts `RunState.from_string` calls (the restores actually made)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = RunState.from_string

        async def counting(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await original(*args, **kwargs)

        monkeypatch.setattr(RunState, "from_string", counting)


@pytest.fixture
async def states() -> AsyncIterator[RestoredStates]:
    agent = build_demo_agent()
    tasks: list[asyncio.Task[Any]] = []

    def spawn(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        tasks.append(task)
        return task

    yield RestoredStates(lambda graph: agent, spawn, limit=3)
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_one_restore_serves_the_checks_and_the_continuation(
    states: RestoredStates, paused_state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    restores = Restores(monkeypatch)
    stored = checkpoint(paused_state)
    states.prepare(stored, GRAPH)
    assert states.checkpoint("r_1", 1) == stored
    assert states.checkpoint("r_1", 2) is None
    first = await states.peek(stored, GRAPH)
    again = await states.peek(stored, GRAPH)
    assert first is again
    assert [item.call_id for item in first.get_interruptions()]
    taken = await states.take(stored, GRAPH)
    assert taken is first
    assert restores.count == 1
    # Taken means gone: the next one is restored anew from the stored JSON.
    assert states.checkpoint("r_1", 1) is None
    fresh = await states.take(stored, GRAPH)
    assert fresh is not first
    assert restores.count == 2


async def test_a_newer_checkpoint_replaces_older_ones_and_the_oldest_go_first(
    states: RestoredStates, paused_state: str
) -> None:
    states.prepare(checkpoint(paused_state, version=1), GRAPH)
    states.prepare(checkpoint(paused_state, version=2), GRAPH)
    assert states.checkpoint("r_1", 1) is None
    assert states.checkpoint("r_1", 2) is not None
    for run in ("r_2", "r_3", "r_4"):  # limit=3
        states.prepare(checkpoint(paused_state, run_id=run), GRAPH)
    assert states.checkpoint("r_1", 2) is None
    assert all(states.checkpoint(run, 1) is not None for run in ("r_2", "r_3", "r_4"))


async def test_a_failed_restore_in_advance_is_made_again_where_it_is_needed(
    states: RestoredStates, paused_state: str
) -> None:
    broken = checkpoint("{not json")
    states.prepare(broken, GRAPH)
    with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises for a bad state
        await states.peek(broken, GRAPH)
    with pytest.raises(Exception):  # noqa: B017
        await states.take(broken, GRAPH)


async def test_another_build_of_the_graph_is_not_reused(
    paused_state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = [build_demo_agent()]
    states = RestoredStates(lambda graph: agents[-1], lambda c, n: asyncio.create_task(c))
    restores = Restores(monkeypatch)
    stored = checkpoint(paused_state)
    first = await states.peek(stored, GRAPH)
    agents.append(build_demo_agent())  # the registry rebuilt the graph meanwhile
    assert await states.take(stored, GRAPH) is not first
    assert restores.count == 2
