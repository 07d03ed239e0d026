"""Restored checkpoints, shared by a pause's decisions and its continuation.

Restoring a checkpoint (`RunState.from_string`) is the costliest step between a decision and
the continuation's first event (3-5 ms for a small state, tens of ms for a long one), and a
paused run needed it once per decision (to check the call's binding) and once more to continue.
A checkpoint row never changes once written (its key is the run and the version), so its
restore can be made once and reused: started in the background right after the pause is stored
(from the JSON just written, so before any reviewer can decide), read by the binding checks
(which only look), and finally *taken* by the continuation, which applies the decisions and
input to it and streams on. A restore that is not here (another process paused the run, this
one restarted, or the entry was evicted) is made from the stored row, exactly as before.

Entries are bounded (least recently used first out): a pause nobody decides for hours costs
its memory only until newer pauses push it out.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agents.run_state import RunState

from gateway.agents.registry import AgentGraph
from persistence.checkpoints import CheckpointRecord

log = logging.getLogger(__name__)

MAX_ENTRIES = 64


@dataclass
class _Entry:
    checkpoint: CheckpointRecord
    agent: Any
    # Resolves to the restored state, or to None when the background restore failed (the
    # next use then restores again and gets the error itself).
    state: asyncio.Future[RunState[Any, Any] | None]


async def restore_state(
    checkpoint: CheckpointRecord, graph: AgentGraph, agent: Any
) -> RunState[Any, Any]:
    """The checkpoint's state, its context as the graph reads it back (`restore_context`)."""
    return await RunState.from_string(
        agent, checkpoint.state, context_deserializer=graph.restore_context
    )


class RestoredStates:
    def __init__(
        self,
        agent_for: Callable[[AgentGraph], Any],
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        limit: int = MAX_ENTRIES,
    ) -> None:
        self._agent_for = agent_for
        self._spawn = spawn
        self._limit = limit
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()

    def prepare(self, checkpoint: CheckpointRecord, graph: AgentGraph) -> None:
        """Restore `checkpoint` in the background (it was just stored for a pause)."""
        run_id = checkpoint.run_id
        for key in [k for k in self._entries if k[0] == run_id]:
            del self._entries[key]  # older checkpoints of the run: the run moved past them
        agent = self._agent_for(graph)
        task = self._spawn(self._restore_quietly(checkpoint, graph, agent), f"restore-{run_id}")
        self._put(_Entry(checkpoint, agent, task))

    def checkpoint(self, run_id: str, version: int) -> CheckpointRecord | None:
        """The stored checkpoint `version` of the run, if it is here (saves reading it)."""
        entry = self._entries.get((run_id, version))
        return entry.checkpoint if entry is not None else None

    async def peek(self, checkpoint: CheckpointRecord, graph: AgentGraph) -> RunState[Any, Any]:
        """The restored state, to look at only (it stays here for the continuation)."""
        key = (checkpoint.run_id, checkpoint.version)
        entry = self._usable(key, graph)
        if entry is not None:
            self._entries.move_to_end(key)
            state = await asyncio.shield(entry.state)
            if state is not None:
                return state
            self._entries.pop(key, None)
        agent = self._agent_for(graph)
        state = await restore_state(checkpoint, graph, agent)
        done: asyncio.Future[RunState[Any, Any] | None] = asyncio.get_running_loop().create_future()
        done.set_result(state)
        self._put(_Entry(checkpoint, agent, done))
        return state

    async def take(self, checkpoint: CheckpointRecord, graph: AgentGraph) -> RunState[Any, Any]:
        """The restored state for the caller alone (it may change it): removed from here."""
        key = (checkpoint.run_id, checkpoint.version)
        entry = self._usable(key, graph)
        self._entries.pop(key, None)
        if entry is not None:
            state = await asyncio.shield(entry.state)
            if state is not None:
                return state
        return await restore_state(checkpoint, graph, self._agent_for(graph))

    def forget(self, checkpoint: CheckpointRecord) -> None:
        """The state `peek` gave was taken after all, by a continuation its decision's
        transaction started (gateway/run_lifecycle/decisions.py): no longer here to look at."""
        self._entries.pop((checkpoint.run_id, checkpoint.version), None)

    def _usable(self, key: tuple[str, int], graph: AgentGraph) -> _Entry | None:
        entry = self._entries.get(key)
        # Restored against another build of the graph (the registry changed): not this one.
        if entry is None or entry.agent is not self._agent_for(graph):
            return None
        return entry

    def _put(self, entry: _Entry) -> None:
        key = (entry.checkpoint.run_id, entry.checkpoint.version)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    async def _restore_quietly(
        self, checkpoint: CheckpointRecord, graph: AgentGraph, agent: Any
    ) -> RunState[Any, Any] | None:
        try:
            return await restore_state(checkpoint, graph, agent)
        except Exception:
            log.warning(
                "restoring checkpoint %d of run %s in advance failed",
                checkpoint.version,
                checkpoint.run_id,
                exc_info=True,
            )
            return None
