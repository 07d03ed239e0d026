"""Continuing a run from its newest checkpoint: after its decisions, a suspension, or a crash.

A continuation restores the checkpoint against the registered graph (or takes the restore
made for the pause's decisions, gateway/run_lifecycle/restored_checkpoints.py), applies the recorded
decisions and the staged input, and starts a new segment. Each run has at most one at a time: it is
won by a compare-and-swap pinned to the checkpoint version (`waiting_for_review -> resuming`,
`suspended -> resuming`, or the recovery's `recovering`), and it runs under the thread's lock.
The decision that leaves nothing pending makes the first of these in its own transaction and,
prepared before it (`prepare_after_decision`), starts the continuation there too, the claim,
the lease and the move to `running` in one statement (`claim_after_decision_in`):
`approval.decided` and `run.resumed` are one commit. Only staged input (which the SDK may
refuse, so it is applied before anything is stored) leaves the continuation a transaction of
its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import orjson
from agents.items import ToolApprovalItem
from agents.run_state import RunState
from sqlalchemy.engine import Connection

from gateway.agents.edited_arguments import edits_of
from gateway.agents.registry import AgentGraph
from gateway.agents.run_caller import RunCaller, caller_of, latest_decision
from gateway.event_log.writer import EventLog
from gateway.protocol.error_codes import conflict
from gateway.protocol.frames import EventType
from gateway.run_lifecycle.approval_binding import binding_problem, by_call_id
from gateway.run_lifecycle.context import RunContext
from gateway.run_lifecycle.execution import Segment, storage_retry
from gateway.storage.health import log_failure
from persistence.approvals import ApprovalRecord, ApprovalRepository, ApprovalStatus
from persistence.checkpoints import CheckpointRecord
from persistence.errors import StaleWrite
from persistence.events import NewEvent
from persistence.inputs import Disposition, InputRepository, PendingInput
from persistence.leases import Lease, LeaseLost, LeaseRepository
from persistence.run_status import RunStatus
from persistence.runs import RunRecord, RunRepository
from persistence.session_marks import SessionMarks

log = logging.getLogger(__name__)


class PauseInputs(NamedTuple):
    """A paused run's inputs as one transaction read them: what a continuation after its
    decisions applies, and what it leaves behind."""

    # the approvals of the pause (its checkpoint's)
    approvals: list[ApprovalRecord]
    # the run's staged input
    staged: list[PendingInput]
    # the ids of the run's pending approvals of any other checkpoint (superseded by it)
    pending_elsewhere: list[str]


RESUMABLE_FROM = (RunStatus.WAITING_FOR_REVIEW,)
# Decisions a continuation applies to its call (superseded ones leave the call to ask again).
APPLIED = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED)
# Where a continuation starts, having won its compare-and-swap (or taken over a lost run).
CONTINUING = (RunStatus.RESUMING, RunStatus.RECOVERING)


class Continuer:
    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx

    async def continue_when_decided(
        self, run: RunRecord, known: PauseInputs | None = None, *, claimed: bool = False
    ) -> None:
        """`known`: the pause's approvals and staged input as the decision's own transaction
        read them (after its write, so the last of concurrent deciders sees every decision);
        `claimed`: that transaction also won the run's compare-and-swap to `resuming`. A retry
        reads them again (a failed attempt put the run back to `waiting_for_review`)."""

        async def attempt() -> None:
            nonlocal known, claimed
            inputs, known = known, None
            won, claimed = claimed, False
            async with self._ctx.lock(run.thread_id):
                await self.maybe_continue(run, inputs, claimed=won)

        # Let the decision's ack (queued by the caller right after this task was made) go out
        # first: otherwise the continuation's restore and decisions, which need not wait for
        # anything when `known` is given, would run before the socket's writer sends it.
        await asyncio.sleep(0)

        try:
            await storage_retry(attempt)
        except Exception as exc:
            # The run stays waiting_for_review with every decision recorded; the next start
            # (or the next decision) retries the continuation.
            log_failure(log, exc, "continuing run %s after its decisions failed", run.run_id)

    async def maybe_continue(
        self, run: RunRecord, known: PauseInputs | None = None, *, claimed: bool = False
    ) -> None:
        """Start the continuation once every approval of the pause is decided (exactly once).
        `claimed`: the caller already won the compare-and-swap to `resuming` (with `known`)."""
        ctx = self._ctx
        if known is None:
            known = await ctx.store.read(partial(pause_inputs_in, run=run))
        approvals, staged, _ = known
        if not claimed:
            if not all_decided(approvals):
                return
            if not await ctx.store.write(partial(claim_in, run=run)):
                return  # someone else won the compare-and-swap
        try:
            await self.continue_run(run, approvals, EventType.RUN_RESUMED, staged=staged)
        except Exception:
            # Put the run back so the decision is not lost; it can be retried or recovered.
            await ctx.runs.transition(
                run.run_id, RunStatus.WAITING_FOR_REVIEW, expected=(RunStatus.RESUMING,)
            )
            raise

    async def _staged(self, run: RunRecord) -> list[PendingInput]:
        return await self._ctx.inputs.open(
            thread_id=run.thread_id, disposition=Disposition.STAGED, run_id=run.run_id
        )

    async def resume_suspended(self, run: RunRecord) -> bool:
        """Continue a suspended run from its checkpoint (caller holds the thread lock)."""
        ctx = self._ctx
        if ctx.closing:
            return False
        if not await ctx.runs.transition(
            run.run_id,
            RunStatus.RESUMING,
            expected=(RunStatus.SUSPENDED,),
            checkpoint_version=run.checkpoint_version,
        ):
            return False
        try:
            await self.continue_run(run, [], EventType.RUN_RESUMED)
        except Exception:
            await ctx.runs.transition(
                run.run_id, RunStatus.SUSPENDED, expected=(RunStatus.RESUMING,)
            )
            raise
        return True

    async def continue_run(
        self,
        run: RunRecord,
        approvals: list[ApprovalRecord],
        announce: EventType,
        checkpoint: CheckpointRecord | None = None,
        lease: Lease | None = None,
        *,
        staged: list[PendingInput] | None = None,
    ) -> None:
        """Restore the newest checkpoint, apply decisions and staged input, stream on.

        The run moves from `resuming` or `recovering` to `running` in the transaction that logs
        `announce`. Takes the run's lease (a paused run has none) unless the caller already
        holds it. `staged`: the run's staged input, when the caller read it already.
        """
        ctx = self._ctx
        checkpoint = (
            checkpoint
            or ctx.restored.checkpoint(run.run_id, run.checkpoint_version)
            or await ctx.checkpoints.latest(run.run_id)
        )
        if checkpoint is None:
            raise conflict("the run has no checkpoint")
        graph = ctx.graph_for_checkpoint(run, checkpoint)
        # Usually restored already, for the decisions' binding checks
        # (gateway/run_lifecycle/restored_checkpoints.py).
        state = await ctx.restored.take(checkpoint, graph)
        calls = by_call_id(state.get_interruptions())
        decisions = sort_decisions(calls, approvals)
        if staged is None:
            staged = await self._staged(run)
        prepare: Callable[[], None] | None = partial(
            apply_decisions, state, decisions.decided, staged
        )
        if staged:
            # The SDK may refuse input (docs/architecture.md "SDK behaviours"): refused here, before
            # anything is stored, the run stays as it was.
            apply_decisions(state, decisions.decided, staged)
            prepare = None
        # Before anything is stored, like the staged input: a context the graph's deserializer
        # cannot rebuild leaves the run as it was.
        caller = await ctx.caller(run, approvals)
        context = graph.resumed_context(checkpoint.state, caller)
        start = Resumption(run, checkpoint, graph, state, calls, caller, context)
        staged_ids = [p.input_id for p in staged]

        def take_and_run(conn: Connection) -> tuple[Lease, RunRecord]:
            if lease is None:
                taken = self._take_in(conn, run)
                if taken is not None:
                    return taken
            # The caller holds the lease, or the one statement refused: step by step, to
            # tell which refusal it was.
            held = lease or LeaseRepository.acquire_in(
                conn, run.run_id, ctx.instance_id, ctx.lease_ttl_s, ctx.incarnation
            )
            if held is None:
                raise LeaseLost(run.run_id)  # another live process executes this run
            current = RunRepository.transition_returning_in(
                conn, run.run_id, RunStatus.RUNNING, expected=CONTINUING
            )
            if current is None:
                raise StaleWrite(run.run_id)
            return held, current

        def mark_running(conn: Connection) -> Continued:
            return continued_in(conn, start, *take_and_run(conn), decisions, staged_ids)

        continued, _ = await ctx.log.commit(
            [start.announcement(ctx.log, announce, lease)], mark_running, agent=run.agent
        )
        logged: frozenset[str] = frozenset()
        if announce is EventType.RUN_RECOVERED:
            outputs = await ctx.events.for_run(run.thread_id, run.run_id, (EventType.TOOL_OUTPUT,))
            logged = frozenset(orjson.loads(e.data).get("call_id") for e in outputs)
        self.launch(start, continued, prepare, logged)

    def prepare_after_decision(
        self, run: RunRecord, pause: Pause, reviewer: str
    ) -> Resumption | None:
        """The continuation a decision by `reviewer` starts if it leaves nothing pending, made
        before the decision is recorded so its transaction can start it too
        (`claim_after_decision_in`); None when the graph cannot rebuild its context (the
        continuation then runs on its own, meets the same error there, and says so)."""
        caller = caller_of(run, reviewer)
        try:
            context = pause.graph.resumed_context(pause.checkpoint.state, caller)
        except Exception:
            return None
        return Resumption(run, *pause, caller, context)

    def claim_after_decision_in(
        self, conn: Connection, run: RunRecord, start: Resumption | None
    ) -> tuple[PauseInputs, bool, Continued | None]:
        """After a decision's write, in its transaction: the pause's inputs; whether this
        transaction claimed the continuation (nothing is left pending and it won the
        compare-and-swap out of `waiting_for_review` at the pause's version); and the
        continuation, when the transaction started it too. Of concurrent deciders only the
        last to commit sees nothing pending, and only once.

        `start` (made before the transaction, `prepare_after_decision`) is started there when
        it fits what the transaction read: the claim, the lease and the move to `running` in
        one statement. Otherwise, with the lease not free, or staged input (which the SDK may
        refuse, so it is applied before anything is stored), or a later decision by someone
        else (another caller), the transaction only claims, and the continuation starts on its
        own (`continue_when_decided`)."""
        known = pause_inputs_in(conn, run)
        if not all_decided(known.approvals):
            return known, False, None
        latest = latest_decision(known.approvals)
        if (
            start is not None
            and not known.staged
            and latest is not None
            and latest.reviewer == start.caller.decided_by
        ):
            taken = self._take_in(conn, run, claiming=start.checkpoint)
            if taken is not None:
                decisions = sort_decisions(start.calls, known.approvals)
                continued = continued_in(
                    conn, start, *taken, decisions, [], known.pending_elsewhere, trimmed=True
                )
                return known, True, continued
        # Refused, if by another claim, the claim alone is refused too.
        return known, claim_in(conn, run), None

    def launch(
        self,
        start: Resumption,
        continued: Continued,
        prepare: Callable[[], None] | None,
        logged_outputs: frozenset[str] = frozenset(),
    ) -> None:
        """Stream the continuation as its transaction left it (`continued`)."""
        ctx = self._ctx
        if continued.superseded:
            ctx.bus.publish_inbox(start.run.tenant, removed=continued.superseded)
        decided = continued.decisions.decided
        ctx.launch(
            Segment(
                run=continued.run,
                graph=start.graph,
                agent=ctx.agent(start.graph),
                start=start.state,
                caller=start.caller,
                context=start.context,
                known_calls=continued.decisions.known_calls,
                logged_outputs=logged_outputs,
                lease=continued.lease,
                prepare=prepare,
                edits=approved_edits(a for a, _ in decided),
            )
        )

    def launch_after_decision(self, start: Resumption, continued: Continued) -> None:
        """Stream the continuation a decision's transaction started
        (`claim_after_decision_in`). The state the decisions' binding checks looked at is
        the continuation's from here on; nothing else may look at it."""
        self._ctx.restored.forget(start.checkpoint)
        self.launch(
            start, continued, partial(apply_decisions, start.state, continued.decisions.decided, [])
        )

    def _take_in(
        self, conn: Connection, run: RunRecord, *, claiming: CheckpointRecord | None = None
    ) -> tuple[Lease, RunRecord] | None:
        """The run's lease taken and its status moved to `running`, in one statement; None
        when either would be refused (nothing written). `claiming`: the pause's checkpoint,
        to claim the continuation there as `claim_in` would, rather than after a claim made
        before, and trim the session back to the checkpoint's mark (`continued_in`)."""
        ctx = self._ctx
        return RunRepository.take_lease_moving_in(
            conn,
            run.run_id,
            RunStatus.RUNNING,
            expected=RESUMABLE_FROM if claiming else CONTINUING,
            through=RunStatus.RESUMING if claiming else None,
            checkpoint_version=run.checkpoint_version if claiming else None,
            trim_session_after=claiming.session_mark if claiming else None,
            owner=ctx.instance_id,
            ttl_s=ctx.lease_ttl_s,
            incarnation=ctx.incarnation,
        )


class SortedDecisions(NamedTuple):
    """A pause's decisions against the calls of its checkpoint."""

    # call id -> tool name of every call an approval of the pause is for
    known_calls: dict[str, str]
    # approved, but not for the call as it stands in the checkpoint: never applied
    unbound: list[str]
    # the decisions the continuation applies, with their calls
    decided: list[tuple[ApprovalRecord, ToolApprovalItem]]


def sort_decisions(
    calls: Mapping[str, ToolApprovalItem], approvals: Iterable[ApprovalRecord]
) -> SortedDecisions:
    """Sort the pause's `approvals` against its checkpoint's pending `calls` (by call id)."""
    sorted_ = SortedDecisions({}, [], [])
    for approval in approvals:
        item = calls.get(approval.call_id)
        if item is None:
            continue
        sorted_.known_calls[approval.call_id] = approval.tool_name
        if approval.status is ApprovalStatus.APPROVED:
            problem = binding_problem(approval, item)
            if problem is not None:
                # Left undecided, the call pauses the run again with a fresh approval.
                log.warning("approval %s not applied: %s", approval.approval_id, problem)
                sorted_.unbound.append(approval.approval_id)
                continue
        if approval.status in APPLIED:
            sorted_.decided.append((approval, item))
    return sorted_


class Pause(NamedTuple):
    """A run's pause as its decisions see it: the checkpoint, restored against the graph."""

    checkpoint: CheckpointRecord
    graph: AgentGraph
    state: RunState[Any, Any]
    # the checkpoint's calls waiting for a decision, by call id
    calls: Mapping[str, ToolApprovalItem]


@dataclass(frozen=True)
class Resumption:
    """A continuation made up to its transaction: the checkpoint restored, who the run runs
    for and with which context, everything that may refuse before anything is stored."""

    run: RunRecord
    checkpoint: CheckpointRecord
    graph: AgentGraph
    state: RunState[Any, Any]
    # the checkpoint's calls waiting for a decision, by call id
    calls: Mapping[str, ToolApprovalItem]
    caller: RunCaller
    context: Any

    def announcement(
        self, log: EventLog, announce: EventType, lease: Lease | None = None
    ) -> NewEvent:
        """The event that says the run goes on (`run.resumed`, `run.recovered`)."""
        data = {"checkpoint_version": self.checkpoint.version}
        return log.new_event(self.run.thread_id, self.run.run_id, announce, data, lease)


class Continued(NamedTuple):
    """A continuation as its transaction left it."""

    lease: Lease
    run: RunRecord
    decisions: SortedDecisions
    # the run's approvals left pending, superseded (out of the reviewers' inbox)
    superseded: list[str]


UNBOUND_REASON = "not bound to its call: the checkpoint's call differs"


def continued_in(
    conn: Connection,
    start: Resumption,
    lease: Lease,
    run: RunRecord,
    decisions: SortedDecisions,
    staged_ids: list[int],
    pending_elsewhere: list[str] | None = None,
    *,
    trimmed: bool = False,
) -> Continued:
    """What a continuation writes once it holds the run's `lease` and the run is running.
    `pending_elsewhere`: the run's pending approvals, when its transaction read them already
    (`PauseInputs`); `trimmed`: the session was trimmed with the lease's take."""
    InputRepository.consume_in(conn, staged_ids)
    ApprovalRepository.supersede_in(conn, decisions.unbound, reason=UNBOUND_REASON)
    # Whatever is still pending belongs to a pause this continuation leaves behind (a
    # recovery from a newer checkpoint): nobody can decide it any more.
    superseded = ApprovalRepository.supersede_pending_in(conn, run.run_id, pending_elsewhere)
    # History written after the checkpoint belongs to a lost attempt (crash recovery).
    if not trimmed:
        SessionMarks.trim_in(conn, run.thread_id, start.checkpoint.session_mark)
    return Continued(lease, run, decisions, superseded)


def approved_edits(approvals: Iterable[ApprovalRecord]) -> Mapping[str, str]:
    """The edited arguments of the calls approved with an edit, for their tools to run with."""
    return edits_of(
        {
            a.call_id: a.edited_arguments
            for a in approvals
            if a.status is ApprovalStatus.APPROVED and a.edited_arguments is not None
        }
    )


def pause_inputs_in(conn: Connection, run: RunRecord) -> PauseInputs:
    """The inputs of the run's current pause, in `conn`'s transaction."""
    read = ApprovalRepository.of_pause_in(
        conn, run.run_id, run.checkpoint_version, thread_id=run.thread_id
    )
    staged = (
        InputRepository.open_in(
            conn, thread_id=run.thread_id, disposition=Disposition.STAGED, run_id=run.run_id
        )
        if read.staged_input
        else []
    )
    return PauseInputs(read.approvals, staged, read.pending_elsewhere)


def all_decided(approvals: list[ApprovalRecord]) -> bool:
    return not any(a.status is ApprovalStatus.PENDING for a in approvals)


def claim_in(conn: Connection, run: RunRecord) -> bool:
    """The continuation's compare-and-swap, `waiting_for_review -> resuming` at the pause's
    checkpoint: True for the one caller that wins it."""
    return RunRepository.transition_in(
        conn,
        run.run_id,
        RunStatus.RESUMING,
        expected=RESUMABLE_FROM,
        checkpoint_version=run.checkpoint_version,
    )


def apply_decisions(
    state: RunState[Any, Any],
    decided: list[tuple[ApprovalRecord, ToolApprovalItem]],
    staged: list[PendingInput],
) -> None:
    """The recorded decisions, then the staged input, onto a restored state."""
    for approval, item in decided:
        if approval.status is ApprovalStatus.APPROVED:
            state.approve(item)
        # The reason is exactly what the model is told; without one the SDK's default.
        # An expiry is a reject by the system, with the expiry as its reason.
        elif approval.reason:
            state.reject(item, rejection_message=approval.reason)
        else:
            state.reject(item)
    for pending in staged:
        state.add_input(pending.input)
