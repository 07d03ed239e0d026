"""Retrying a failed run from its last checkpoint (docs/protocol.md §4 `run.retry`).

A failed run stays failed: `run.failed` is final and a finished run never continues. A retry
is a new run on the same thread that answers the same input and goes on from the failed run's
last boundary (the turn checkpoint before the failure, or the pause whose decisions it was
continuing), so only the turn it failed in is repeated:

- the failed run keeps that boundary when it ends (`CheckpointRepository.add_final_in` with
  `keep_previous`); it becomes the retry's checkpoint 1, and the pause's recorded decisions
  (edited arguments included) are copied to it, so they apply to the retry's first segment and
  again to its own crash recovery, which continues from the same place;
- the conversation's history goes back to that checkpoint's session mark (what the failed turn
  wrote after it belonged to the lost attempt), in the retry's first transaction;
- the retry shares the failed run's operation-ledger scope (gateway/agents/exactly_once.py): a
  side effect the failed run already made returns its recorded result instead of running again;
- tool outputs the failed run already logged are not logged again;
- the retry's token usage starts from nothing: the boundary's state carries the failed run's
  count, which the failed run's own `run.failed` already reported.

A failed run with no such checkpoint (it failed in its first turn, or retention removed its
checkpoints) is retried from its input, with the history as it was before that run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from agents.run_state import RunState
from agents.usage import Usage, serialize_usage
from sqlalchemy.engine import Connection

from gateway.agents.registry import AgentGraph
from gateway.agents.run_caller import RunCaller, caller_of
from gateway.auth.access import check_can_act_on_thread
from gateway.auth.audit_trail import answered_again_entry
from gateway.protocol.error_codes import ErrorCode, GatewayError, conflict
from gateway.protocol.frames import EventType
from gateway.protocol.identity import Principal
from gateway.run_lifecycle.context import RunContext, thread_ref
from gateway.run_lifecycle.continuation import APPLIED, apply_decisions, approved_edits
from gateway.run_lifecycle.execution import Segment
from gateway.run_lifecycle.restored_checkpoints import restore_state
from gateway.run_lifecycle.started import Started
from persistence.approvals import ApprovalRecord, ApprovalRepository
from persistence.audit import AuditRepository
from persistence.checkpoints import CheckpointRecord, CheckpointRepository
from persistence.clock import utcnow
from persistence.ids import new_id
from persistence.leases import LeaseRepository
from persistence.run_status import RunStatus
from persistence.runs import RunRecord, RunRepository
from persistence.session_marks import SessionMarks
from persistence.threads import ThreadRecord

# The reason a retry's first checkpoint is stored with (the failed run's boundary, copied).
RETRY_REASON = "retry"


def without_usage(state: str) -> str:
    """A serialized state whose run-wide token count starts again from nothing. The SDK keeps
    it in the state's context (`context.usage`), so a run restored from another run's state
    would report that run's tokens as its own."""
    data = orjson.loads(state)
    data["context"]["usage"] = serialize_usage(Usage())
    return orjson.dumps(data).decode()


@dataclass
class _Boundary:
    """Where a retry goes on from: the failed run's checkpoint, restored, decisions applied."""

    checkpoint: CheckpointRecord
    state: RunState[Any, Any]
    # The failed run's decisions at that checkpoint, applied to `state`: copied to the retry.
    approvals: list[ApprovalRecord]
    known_calls: dict[str, str]
    edits: Mapping[str, str]
    caller: RunCaller
    context: Any


class Retries:
    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx

    async def retry(
        self, principal: Principal, run_id: str, *, admit: Callable[[str], None] | None = None
    ) -> Started:
        """A new run that goes on from the failed run `run_id`'s last checkpoint. Refused
        (`conflict`) unless that run failed and is still the thread's last run. `admit` as in
        `RunManager.start_run`, called with the run's thread."""
        ctx = self._ctx
        if ctx.closing:
            raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
        failed, thread = await ctx.run_for(principal, run_id)
        check_can_act_on_thread(principal, thread_ref(thread))
        async with ctx.lock(thread.thread_id):
            if await ctx.runs.active_for_thread(thread.thread_id) is not None:
                raise conflict("the thread's run is still active")
            failed = await ctx.runs.get(run_id) or failed
            if failed.status is not RunStatus.FAILED:
                raise conflict(f"only a failed run can be retried; this one is {failed.status}")
            last = await ctx.runs.of_thread(thread.thread_id, limit=1)
            if last and last[-1].run_id != failed.run_id:
                raise conflict("only the thread's last run can be retried")
            graph = ctx.graph(failed.agent)
            boundary = await self._boundary(failed, graph)
            if admit is not None:
                admit(thread.thread_id)
            return await self._start(principal, failed, thread, graph, boundary)

    async def _boundary(self, failed: RunRecord, graph: AgentGraph) -> _Boundary | None:
        ctx = self._ctx
        checkpoint = await ctx.checkpoints.latest_resumable(failed.run_id)
        if checkpoint is None:
            return None
        checkpoint = replace(checkpoint, state=without_usage(checkpoint.state))
        graph = ctx.graph_for_checkpoint(failed, checkpoint)
        state = await restore_state(checkpoint, graph, ctx.agent(graph))
        approvals = [
            a
            for a in await ctx.approvals.for_checkpoint(failed.run_id, checkpoint.version)
            if a.status in APPLIED
        ]
        # The pause's decisions were checked against this very checkpoint when they were made.
        by_call = {item.call_id: item for item in state.get_interruptions()}
        decided = [(a, by_call[a.call_id]) for a in approvals if a.call_id in by_call]
        apply_decisions(state, decided, [])
        caller = await ctx.caller(failed, approvals)
        return _Boundary(
            checkpoint=checkpoint,
            state=state,
            approvals=[a for a, _ in decided],
            known_calls={a.call_id: a.tool_name for a, _ in decided},
            edits=approved_edits(a for a, _ in decided),
            caller=caller,
            context=graph.resumed_context(checkpoint.state, caller),
        )

    async def _start(
        self,
        principal: Principal,
        failed: RunRecord,
        thread: ThreadRecord,
        graph: AgentGraph,
        boundary: _Boundary | None,
    ) -> Started:
        ctx = self._ctx
        now = utcnow()
        run = replace(
            failed,
            run_id=new_id("r"),
            status=RunStatus.RUNNING,
            graph_version=graph.version,
            checkpoint_version=0,
            error=None,
            created_at=now,
            updated_at=now,
            ledger_scope=failed.operations_scope,
        )
        first: CheckpointRecord | None = None
        if boundary is not None:
            first = replace(
                boundary.checkpoint,
                run_id=run.run_id,
                version=1,
                state=boundary.checkpoint.state,
                reason=RETRY_REASON,
                created_at=now,
            )
        # The history the retry starts on: up to the boundary, or to where the failed run began.
        mark = first.session_mark if first is not None else failed.session_mark
        instance_id, ttl_s, incarnation = ctx.instance_id, ctx.lease_ttl_s, ctx.incarnation

        # The decisions go on with the checkpoint, under new ids (an approval id names one
        # run's decision); decided already, so nobody is asked and no inbox hears of them.
        copied = [
            replace(a, approval_id=new_id("ap"), run_id=run.run_id, checkpoint_version=1)
            for a in (boundary.approvals if boundary is not None else ())
        ]
        audit = answered_again_entry(
            principal, run_id=run.run_id, thread_id=run.thread_id, retries=failed.run_id
        )

        def insert(conn: Connection) -> Any:
            SessionMarks.trim_in(conn, run.thread_id, mark)
            RunRepository.insert_in(conn, run)
            AuditRepository.insert_in(conn, audit)
            if first is not None:
                CheckpointRepository.save_in(
                    conn, first, status=RunStatus.RUNNING, expected=(RunStatus.RUNNING,)
                )
                ApprovalRepository.insert_in(conn, copied)
            return LeaseRepository.acquire_in(conn, run.run_id, instance_id, ttl_s, incarnation)

        data: dict[str, Any] = {"input": failed.input, "agent": graph.name}
        data["retries"] = failed.run_id
        data["checkpoint_version"] = boundary.checkpoint.version if boundary else None
        started = ctx.log.new_event(run.thread_id, run.run_id, EventType.RUN_STARTED, data)
        lease, logged = await ctx.log.commit([started], insert, agent=graph.name)
        if first is not None:
            run = replace(run, checkpoint_version=first.version)
        if boundary is None:
            caller = caller_of(run)
            segment = Segment(
                run=run,
                graph=graph,
                agent=ctx.agent(graph),
                start=failed.input,
                caller=caller,
                context=graph.new_context(caller),
                lease=lease,
            )
        else:
            outputs = await ctx.events.for_run(
                failed.thread_id, failed.run_id, (EventType.TOOL_OUTPUT,)
            )
            segment = Segment(
                run=run,
                graph=graph,
                agent=ctx.agent(graph),
                start=boundary.state,
                caller=boundary.caller,
                context=boundary.context,
                known_calls=boundary.known_calls,
                edits=boundary.edits,
                logged_outputs=frozenset(orjson.loads(e.data).get("call_id") for e in outputs),
                lease=lease,
            )
        ctx.launch(segment)
        return Started(
            thread_id=run.thread_id,
            run_id=run.run_id,
            first_seq=logged[0].seq,
            thread=replace(thread, head_seq=logged[-1].seq),
            events=logged,
            retries=failed.run_id,
            checkpoint_version=data["checkpoint_version"],
        )
