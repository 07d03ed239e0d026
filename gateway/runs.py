"""RunManager: the run lifecycle (PROTOCOL §1, DESIGN "The flow").

start -> running -> (waiting_for_review -> resuming -> running)* -> completed | failed | cancelled,
plus recovering after a crash. Every state change is a compare-and-swap in the database, made in
the same transaction as the event that announces it; per-thread locks serialise this process's
own decisions about one thread (start, input, decide, cancel, finish) so none is lost between a
read and a write.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from agents.run_state import RunState
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.auth import (
    AccessDenied,
    Principal,
    ThreadRef,
    check_can_act_on_thread,
    check_can_create,
    check_can_decide,
    check_can_subscribe,
)
from gateway.bus import EventBus
from gateway.errors import GRAPH_MISMATCH, GatewayError, conflict, not_found
from gateway.eventlog import EventLog
from gateway.execution import Execution, Segment, SegmentRunner, approval_view, storage_retry
from gateway.protocol import ErrorCode, EventType, utc_ts
from gateway.registry import AgentGraph, AgentRegistry, GraphMismatchError, UnknownAgentError
from persistence.approvals import ApprovalRecord, ApprovalRepository, ApprovalStatus
from persistence.checkpoints import CheckpointRecord, CheckpointRepository
from persistence.db import utcnow
from persistence.errors import StaleWrite, StorageUnavailable
from persistence.events import EventRepository, NewEvent
from persistence.ids import new_id
from persistence.inputs import Disposition, InputRepository
from persistence.leases import Lease, LeaseLost, LeaseRepository
from persistence.runs import ACTIVE, RunRecord, RunRepository, RunStatus
from persistence.sessions import SessionMarks
from persistence.threads import ThreadRecord, ThreadRepository

log = logging.getLogger(__name__)

RESUMABLE_FROM = (RunStatus.WAITING_FOR_REVIEW,)


@dataclass(frozen=True)
class Started:
    thread_id: str
    run_id: str
    first_seq: int  # seq of the run's `run.started` event


def thread_ref(thread: ThreadRecord) -> ThreadRef:
    return ThreadRef(tenant=thread.tenant, owner=thread.owner)


def denied(exc: AccessDenied) -> GatewayError:
    return GatewayError(exc.code, exc.message)


class RunManager:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        log: EventLog,
        bus: EventBus,
        registry: AgentRegistry,
        segments_factory: Callable[..., SegmentRunner],
        self_approval: bool,
        suspend_grace_s: float = 15.0,
        instance_id: str = "gateway",
        lease_ttl_s: float = 15.0,
    ) -> None:
        self._engine = engine
        self._log = log
        self._bus = bus
        self._registry = registry
        self._self_approval = self_approval
        self.threads = ThreadRepository(engine)
        self.runs = RunRepository(engine)
        self.approvals = ApprovalRepository(engine)
        self.checkpoints = CheckpointRepository(engine)
        self.inputs = InputRepository(engine)
        self.events = EventRepository(engine)
        self.sessions = SessionMarks(engine)
        self.leases = LeaseRepository(engine)
        self._segments = segments_factory(
            on_inbox_added=self._inbox_added,
            on_finished=self._finished,
            on_suspended=self._suspended,
        )
        self._executions: dict[str, Execution] = {}
        self._agents: dict[tuple[str, str, int], Any] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._background: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._suspend_grace_s = suspend_grace_s
        self._instance_id = instance_id
        self._lease_ttl_s = lease_ttl_s
        self._suspend_timers: dict[str, asyncio.TimerHandle] = {}
        bus.on_watchers_changed(self._watchers_changed)

    # -- helpers -------------------------------------------------------------------------

    def _lock(self, thread_id: str) -> asyncio.Lock:
        lock = self._locks.get(thread_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[thread_id] = lock
        return lock

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def thread_for(self, principal: Principal, thread_id: str) -> ThreadRecord:
        thread = await self.threads.get(thread_id)
        if thread is None or thread.tenant != principal.tenant:
            raise not_found("thread not found")
        return thread

    async def run_for(self, principal: Principal, run_id: str) -> tuple[RunRecord, ThreadRecord]:
        run = await self.runs.get(run_id)
        if run is None or run.tenant != principal.tenant:
            raise not_found("run not found")
        thread = await self.thread_for(principal, run.thread_id)
        return run, thread

    def _agent(self, graph: AgentGraph) -> Any:
        """One built agent per graph version, reused by every run and restore.

        SDK agents hold no per-run state, and building one (tool schemas, nested agents) costs
        more than restoring a checkpoint, so it is done once, not on every decision.
        """
        key = (graph.name, graph.version, id(graph))
        agent = self._agents.get(key)
        if agent is None:
            agent = self._agents[key] = graph.build()
        return agent

    def _graph(self, name: str | None) -> AgentGraph:
        try:
            return self._registry.get(name)
        except UnknownAgentError as exc:
            raise GatewayError(ErrorCode.BAD_REQUEST, str(exc)) from None

    def is_executing(self, run_id: str) -> bool:
        return run_id in self._executions

    # -- threads -------------------------------------------------------------------------

    async def create_thread(
        self, principal: Principal, metadata: dict[str, Any] | None
    ) -> ThreadRecord:
        try:
            check_can_create(principal)
        except AccessDenied as exc:
            raise denied(exc) from None
        return await self.threads.create(
            tenant=principal.tenant, owner=principal.user, metadata=metadata
        )

    async def authorize_subscribe(self, principal: Principal, thread_id: str) -> ThreadRecord:
        thread = await self.thread_for(principal, thread_id)
        try:
            check_can_subscribe(principal, thread_ref(thread))
        except AccessDenied as exc:
            raise denied(exc) from None
        return thread

    # -- start ---------------------------------------------------------------------------

    async def start_run(
        self,
        principal: Principal,
        *,
        thread_id: str | None,
        text: str,
        agent: str | None,
        on_disconnect: str,
    ) -> Started:
        """Create a run (and its thread when `thread_id` is None) and start streaming it."""
        if self._closing:
            raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
        graph = self._graph(agent)
        if thread_id is None:
            try:
                check_can_create(principal)
            except AccessDenied as exc:
                raise denied(exc) from None
            thread: ThreadRecord | None = None
            key = new_id("t")  # a lock key nobody else can hold
        else:
            thread = await self.thread_for(principal, thread_id)
            try:
                check_can_act_on_thread(principal, thread_ref(thread))
            except AccessDenied as exc:
                raise denied(exc) from None
            key = thread.thread_id
        async with self._lock(key):
            return await self._start_locked(
                principal.tenant,
                principal.user,
                thread,
                graph,
                text,
                on_disconnect,
            )

    async def _start_locked(
        self,
        tenant: str,
        owner: str,
        thread: ThreadRecord | None,
        graph: AgentGraph,
        text: str,
        on_disconnect: str,
        consumed_input_id: int | None = None,
    ) -> Started:
        if thread is not None and await self.runs.active_for_thread(thread.thread_id):
            raise conflict("the thread already has an active run; send run.input instead")
        run_id = new_id("r")
        thread_id = thread.thread_id if thread else new_id("t")
        session_mark = await self.sessions.head(thread_id) if thread else 0
        now = utcnow()
        record = RunRecord(
            run_id=run_id,
            thread_id=thread_id,
            tenant=tenant,
            owner=owner,
            status=RunStatus.RUNNING,
            agent=graph.name,
            graph_version=graph.version,
            on_disconnect=on_disconnect,
            input=text,
            checkpoint_version=0,
            session_mark=session_mark,
            error=None,
            created_at=now,
            updated_at=now,
        )

        async def insert(conn: AsyncConnection) -> Lease | None:
            if thread is None:
                await ThreadRepository.insert(
                    conn, tenant=tenant, owner=owner, metadata=None, thread_id=thread_id
                )
            await RunRepository.insert(conn, record)
            if consumed_input_id is not None:
                await InputRepository.consume_in(conn, [consumed_input_id], run_id=run_id)
            return await LeaseRepository.acquire_in(
                conn, run_id, self._instance_id, self._lease_ttl_s
            )

        started = self._log.new_event(
            thread_id, run_id, EventType.RUN_STARTED, {"input": text, "agent": graph.name}
        )
        try:
            lease, logged = await self._log.commit([started], insert)
        except IntegrityError:
            # The partial unique index on active runs: another process won the race.
            raise conflict("the thread already has an active run; send run.input instead") from None
        agent = self._agent(graph)
        context = graph.make_context() if graph.make_context else None
        self._launch(
            Segment(run=record, graph=graph, agent=agent, start=text, context=context, lease=lease)
        )
        return Started(thread_id=thread_id, run_id=run_id, first_seq=logged[0].seq)

    def _launch(self, segment: Segment) -> None:
        run = segment.run
        execution = Execution(
            run_id=run.run_id, thread_id=run.thread_id, on_disconnect=run.on_disconnect
        )
        self._executions[run.run_id] = execution

        async def body() -> None:
            try:
                await self._segments.drive(segment, execution)
            finally:
                if self._executions.get(run.run_id) is execution:
                    del self._executions[run.run_id]

        execution.task = self._spawn(body(), name=f"run-{run.run_id}")

    # -- input ---------------------------------------------------------------------------

    async def submit_input(self, principal: Principal, thread_id: str, text: str) -> dict[str, Any]:
        thread = await self.thread_for(principal, thread_id)
        try:
            check_can_act_on_thread(principal, thread_ref(thread))
        except AccessDenied as exc:
            raise denied(exc) from None
        async with self._lock(thread.thread_id):
            run = await self.runs.active_for_thread(thread.thread_id)
            if run is None:
                if self._closing:
                    raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
                started = await self._start_locked(
                    principal.tenant,
                    thread.owner,
                    thread,
                    self._graph(None),
                    text,
                    "continue",
                )
                return {
                    "disposition": "started",
                    "run_id": started.run_id,
                    "first_seq": started.first_seq,
                }
            if run.status in (RunStatus.WAITING_FOR_REVIEW, RunStatus.SUSPENDED):
                await self._check_stageable(run, text)
                await self._record_input(run, text, Disposition.STAGED, EventType.INPUT_STAGED)
                return {"disposition": "staged", "run_id": run.run_id}
            await self._record_input(run, text, Disposition.QUEUED, EventType.INPUT_QUEUED)
            return {"disposition": "queued", "run_id": run.run_id}

    async def _check_stageable(self, run: RunRecord, text: str) -> None:
        """Ask the SDK whether the paused state accepts input, on a throwaway restore."""
        checkpoint = await self.checkpoints.latest(run.run_id)
        if checkpoint is None:
            raise conflict("the run has no checkpoint to stage input on")
        graph = self._graph_for_checkpoint(run, checkpoint)
        state = await RunState.from_string(
            self._agent(graph), checkpoint.state, context_deserializer=graph.context_deserializer
        )
        try:
            state.add_input(text)
        except Exception as exc:
            raise conflict(f"the paused run cannot take input now: {exc}") from None

    async def _record_input(
        self, run: RunRecord, text: str, disposition: Disposition, event: EventType
    ) -> None:
        async def insert(conn: AsyncConnection) -> None:
            await InputRepository.insert_in(
                conn, thread_id=run.thread_id, run_id=run.run_id, text=text, disposition=disposition
            )

        await self._log.commit(
            [self._log.new_event(run.thread_id, run.run_id, event, {"input": text})], insert
        )

    # -- decisions -----------------------------------------------------------------------

    def _graph_for_checkpoint(self, run: RunRecord, checkpoint: CheckpointRecord) -> AgentGraph:
        graph = self._graph(run.agent)
        try:
            graph.check_version(checkpoint.graph_version)
        except GraphMismatchError as exc:
            raise GatewayError(GRAPH_MISMATCH, str(exc)) from None
        return graph

    async def decide(
        self,
        principal: Principal,
        approval_id: str,
        decision: str,
        reason: str | None,
    ) -> ApprovalRecord:
        approval = await self.approvals.get(approval_id)
        if approval is None or approval.tenant != principal.tenant:
            raise not_found("approval not found")
        run, thread = await self.run_for(principal, approval.run_id)
        try:
            check_can_decide(principal, thread_ref(thread), self_approval=self._self_approval)
        except AccessDenied as exc:
            raise denied(exc) from None
        async with self._lock(thread.thread_id):
            run = await self.runs.get(run.run_id) or run
            if approval.status is not ApprovalStatus.PENDING:
                raise conflict(f"approval already {approval.status.value}")
            if (
                run.status is not RunStatus.WAITING_FOR_REVIEW
                or run.checkpoint_version != approval.checkpoint_version
            ):
                raise conflict("approval was superseded: the run has moved on")
            checkpoint = await self.checkpoints.latest(run.run_id)
            if checkpoint is None:
                raise conflict("the run has no checkpoint")
            # Refuse before recording anything: a decision on a run that cannot be restored
            # would otherwise leave it stuck half-decided.
            self._graph_for_checkpoint(run, checkpoint)
            status = ApprovalStatus.APPROVED if decision == "approve" else ApprovalStatus.REJECTED
            now = utcnow()

            async def record(conn: AsyncConnection) -> None:
                if not await ApprovalRepository.decide_in(
                    conn,
                    approval_id,
                    status=status,
                    reviewer=principal.user,
                    reason=reason,
                    checkpoint_version=run.checkpoint_version,
                    decided_at=now,
                ):
                    raise StaleWrite(approval_id)

            event = self._log.new_event(
                run.thread_id,
                run.run_id,
                EventType.APPROVAL_DECIDED,
                {
                    "approval_id": approval_id,
                    "decision": decision,
                    "reason": reason,
                    "reviewer": principal.user,
                    "decided_at": utc_ts(now),
                },
            )
            try:
                await self._log.commit([event], record)
            except StaleWrite:
                raise conflict("approval was already decided") from None
            self._bus.publish_inbox(run.tenant, removed=[approval_id])
            decided = await self.approvals.get(approval_id)
            assert decided is not None
        # The decision is durable; the reviewer's ack need not wait for the restore.
        self._spawn(self._continue_when_decided(run), name=f"continue-{run.run_id}")
        return decided

    async def _continue_when_decided(self, run: RunRecord) -> None:
        async def attempt() -> None:
            async with self._lock(run.thread_id):
                await self._maybe_continue(run)

        try:
            await storage_retry(attempt)
        except Exception:
            # The run stays waiting_for_review with every decision recorded; the next start
            # (or the next decision) retries the continuation.
            log.error("continuing run %s after its decisions failed", run.run_id, exc_info=True)

    async def _maybe_continue(self, run: RunRecord) -> None:
        """Start the continuation once every approval of the pause is decided (exactly once)."""
        approvals = await self.approvals.for_checkpoint(run.run_id, run.checkpoint_version)
        if any(a.status is ApprovalStatus.PENDING for a in approvals):
            return
        if not await self.runs.transition(
            run.run_id,
            RunStatus.RESUMING,
            expected=RESUMABLE_FROM,
            checkpoint_version=run.checkpoint_version,
        ):
            return  # someone else won the compare-and-swap
        try:
            await self._continue(run, approvals, EventType.RUN_RESUMED)
        except Exception:
            # Put the run back so the decision is not lost; it can be retried or recovered.
            await self.runs.transition(
                run.run_id, RunStatus.WAITING_FOR_REVIEW, expected=(RunStatus.RESUMING,)
            )
            raise

    async def _continue(
        self,
        run: RunRecord,
        approvals: list[ApprovalRecord],
        announce: EventType,
        checkpoint: CheckpointRecord | None = None,
        lease: Lease | None = None,
    ) -> None:
        """Restore the newest checkpoint, apply decisions and staged input, stream on.

        Takes the run's lease (a paused run has none) unless the caller already holds it.
        """
        checkpoint = checkpoint or await self.checkpoints.latest(run.run_id)
        if checkpoint is None:
            raise conflict("the run has no checkpoint")
        graph = self._graph_for_checkpoint(run, checkpoint)
        agent = self._agent(graph)
        state = await RunState.from_string(
            agent, checkpoint.state, context_deserializer=graph.context_deserializer
        )
        by_call = {item.call_id: item for item in state.get_interruptions()}
        known_calls: dict[str, str] = {}
        for approval in approvals:
            item = by_call.get(approval.call_id)
            if item is None:
                continue
            known_calls[approval.call_id] = approval.tool_name
            if approval.status is ApprovalStatus.APPROVED:
                state.approve(item)
            elif approval.status is ApprovalStatus.REJECTED:
                # The reason is exactly what the model is told; without one the SDK's default.
                if approval.reason:
                    state.reject(item, rejection_message=approval.reason)
                else:
                    state.reject(item)
        staged = await self.inputs.open(
            thread_id=run.thread_id, disposition=Disposition.STAGED, run_id=run.run_id
        )
        for pending in staged:
            state.add_input(pending.input)
        # History written after the checkpoint belongs to a lost attempt (crash recovery).
        await self.sessions.trim(run.thread_id, checkpoint.session_mark)
        data: dict[str, Any] = {"checkpoint_version": checkpoint.version}
        staged_ids = [p.input_id for p in staged]

        async def mark_running(conn: AsyncConnection) -> Lease:
            held = lease or await LeaseRepository.acquire_in(
                conn, run.run_id, self._instance_id, self._lease_ttl_s
            )
            if held is None:
                raise LeaseLost(run.run_id)  # another live process executes this run
            moved = await RunRepository.transition_in(
                conn,
                run.run_id,
                RunStatus.RUNNING,
                expected=(RunStatus.RESUMING, RunStatus.RECOVERING),
            )
            if not moved:
                raise StaleWrite(run.run_id)
            await InputRepository.consume_in(conn, staged_ids)
            return held

        held, _ = await self._log.commit(
            [self._log.new_event(run.thread_id, run.run_id, announce, data, lease)], mark_running
        )
        current = await self.runs.get(run.run_id) or run
        logged: frozenset[str] = frozenset()
        if announce is EventType.RUN_RECOVERED:
            outputs = await self.events.for_run(run.run_id, (EventType.TOOL_OUTPUT,))
            logged = frozenset(orjson.loads(e.data).get("call_id") for e in outputs)
        self._launch(
            Segment(
                run=current,
                graph=graph,
                agent=agent,
                start=state,
                known_calls=known_calls,
                logged_outputs=logged,
                lease=held,
            )
        )

    # -- cancel and resume ---------------------------------------------------------------

    async def cancel(self, principal: Principal, run_id: str) -> None:
        run, thread = await self.run_for(principal, run_id)
        try:
            check_can_act_on_thread(principal, thread_ref(thread))
        except AccessDenied as exc:
            raise denied(exc) from None
        async with self._lock(thread.thread_id):
            run = await self.runs.get(run_id) or run
            if run.status.terminal:
                raise conflict(f"run already {run.status.value}")
            execution = self._executions.get(run_id)
            if execution is None:
                await self._cancel_idle(run)
                return
            execution.cancel_requested = True
            if execution.result is not None:
                execution.result.cancel("immediate")
        await execution.done.wait()

    async def _cancel_idle(self, run: RunRecord) -> None:
        removed: list[str] = []

        async def transition(conn: AsyncConnection) -> None:
            moved = await RunRepository.transition_in(
                conn, run.run_id, RunStatus.CANCELLED, expected=ACTIVE
            )
            if not moved:
                raise StaleWrite(run.run_id)
            removed.extend(await ApprovalRepository.supersede_pending_in(conn, run.run_id))

        try:
            await self._log.commit(
                [self._log.new_event(run.thread_id, run.run_id, EventType.RUN_CANCELLED, {})],
                transition,
            )
        except StaleWrite:
            raise conflict("the run changed while cancelling; try again") from None
        if removed:
            self._bus.publish_inbox(run.tenant, removed=removed)
        self._spawn(self._start_next_queued(run.thread_id), name="next-queued")

    async def resume(self, principal: Principal, run_id: str) -> None:
        run, thread = await self.run_for(principal, run_id)
        try:
            check_can_act_on_thread(principal, thread_ref(thread))
        except AccessDenied as exc:
            raise denied(exc) from None
        async with self._lock(thread.thread_id):
            run = await self.runs.get(run_id) or run
            if run.status is not RunStatus.SUSPENDED:
                raise conflict(f"run is {run.status.value}, not suspended")
            await self._resume_suspended(run)

    async def _resume_suspended(self, run: RunRecord) -> bool:
        """Continue a suspended run from its checkpoint (caller holds the thread lock)."""
        if self._closing:
            return False
        if not await self.runs.transition(
            run.run_id,
            RunStatus.RESUMING,
            expected=(RunStatus.SUSPENDED,),
            checkpoint_version=run.checkpoint_version,
        ):
            return False
        try:
            await self._continue(run, [], EventType.RUN_RESUMED)
        except Exception:
            await self.runs.transition(
                run.run_id, RunStatus.SUSPENDED, expected=(RunStatus.RESUMING,)
            )
            raise
        return True

    # -- watchers (on_disconnect "suspend") ----------------------------------------------

    def _watchers_changed(self, thread_id: str, watchers: int) -> None:
        timer = self._suspend_timers.pop(thread_id, None)
        if timer is not None:
            timer.cancel()
        if self._closing:
            return
        if watchers == 1:
            self._spawn(self._resume_on_watch(thread_id), name=f"resume-on-watch-{thread_id}")
        if watchers > 0:
            return
        execution = next((e for e in self._executions.values() if e.thread_id == thread_id), None)
        if execution is None or execution.on_disconnect != "suspend":
            return
        self._suspend_timers[thread_id] = asyncio.get_running_loop().call_later(
            self._suspend_grace_s, self._suspend_unwatched, thread_id
        )

    def _suspend_unwatched(self, thread_id: str) -> None:
        self._suspend_timers.pop(thread_id, None)
        if self._bus.watchers(thread_id):
            return
        for execution in self._executions.values():
            if execution.thread_id == thread_id and execution.on_disconnect == "suspend":
                execution.request_stop("disconnect")

    async def _suspended(self, run: RunRecord, reason: str) -> None:
        """A watcher may have arrived after the grace timer fired: continue at once then."""
        if reason == "disconnect" and self._bus.watchers(run.thread_id):
            self._spawn(self._resume_on_watch(run.thread_id), name=f"resume-{run.run_id}")

    async def _resume_on_watch(self, thread_id: str) -> None:
        """A new watcher on a thread continues its suspended run (PROTOCOL §6)."""
        try:
            async with self._lock(thread_id):
                run = await self.runs.active_for_thread(thread_id)
                if run is not None and run.status is RunStatus.SUSPENDED:
                    await self._resume_suspended(run)
        except Exception:
            log.error("resuming the suspended run of thread %s failed", thread_id, exc_info=True)

    # -- endings -------------------------------------------------------------------------

    def _inbox_added(self, tenant: str, views: list[dict[str, Any]]) -> None:
        self._bus.publish_inbox(tenant, added=views)

    async def _finished(self, run: RunRecord, status: RunStatus) -> None:
        if status is RunStatus.CANCELLED:
            self._bus.publish_inbox(
                run.tenant,
                removed=[
                    a.approval_id
                    for a in await self.approvals.for_checkpoint(run.run_id, run.checkpoint_version)
                ],
            )
        self._spawn(self._start_next_queued(run.thread_id), name="next-queued")

    async def _start_next_queued(self, thread_id: str) -> None:
        if self._closing:
            return
        async with self._lock(thread_id):
            if await self.runs.active_for_thread(thread_id):
                return
            queued = await self.inputs.open(thread_id=thread_id, disposition=Disposition.QUEUED)
            if not queued:
                return
            thread = await self.threads.get(thread_id)
            if thread is None:
                return
            nxt = queued[0]
            try:
                await self._start_locked(
                    thread.tenant,
                    thread.owner,
                    thread,
                    self._graph(None),
                    nxt.input,
                    "continue",
                    consumed_input_id=nxt.input_id,
                )
            except (GatewayError, StorageUnavailable):
                log.warning(
                    "could not start the queued input of thread %s", thread_id, exc_info=True
                )

    # -- recovery ------------------------------------------------------------------------

    async def recover(self, *, startup: bool = True) -> int:
        """Take over runs whose process is gone (lease free or expired).

        At start-up also continue pauses whose decisions were all recorded before a crash,
        and runs suspended by a graceful shutdown.
        """
        recovered = 0
        for run in await self.runs.with_status(
            (RunStatus.RUNNING, RunStatus.RESUMING, RunStatus.RECOVERING)
        ):
            if run.run_id in self._executions:
                continue
            if (
                not startup
                and run.status is RunStatus.RESUMING
                and (utcnow() - run.updated_at).total_seconds() < self._lease_ttl_s
            ):
                continue  # a continuation that some process is starting right now
            try:
                recovered += await self._recover_one(run)
            except Exception:
                log.error("recovery of run %s failed", run.run_id, exc_info=True)
        waiting = (
            await self.runs.with_status((RunStatus.WAITING_FOR_REVIEW,))
            if startup
            else await self.runs.decided_but_waiting()
        )
        for run in waiting:
            try:
                async with self._lock(run.thread_id):
                    await self._maybe_continue(run)
            except Exception:
                log.error("resuming decided run %s failed", run.run_id, exc_info=True)
        if not startup:
            return recovered
        for run in await self.runs.with_status((RunStatus.SUSPENDED,)):
            checkpoint = await self.checkpoints.latest(run.run_id)
            if checkpoint is None or checkpoint.reason != "shutdown":
                continue  # suspended for lack of watchers: a watcher continues it
            try:
                async with self._lock(run.thread_id):
                    if await self._resume_suspended(run):
                        recovered += 1
            except Exception:
                log.error("continuing run %s after shutdown failed", run.run_id, exc_info=True)
        return recovered

    def start_recovery(self) -> None:
        """Recover in the background, then keep taking over runs whose lease expired.

        In the background so the gateway listens at once: with many interrupted runs, recovery
        takes a while, and clients can connect (and catch up by cursor) meanwhile.
        """

        async def loop() -> None:
            try:
                recovered = await self.recover()
            except Exception:
                log.error("recovery at start-up failed", exc_info=True)
            else:
                if recovered:
                    log.info("recovered %d run(s) left active by a previous process", recovered)
            while not self._closing:
                await asyncio.sleep(self._lease_ttl_s / 2)
                try:
                    taken = await self.recover(startup=False)
                except Exception:
                    log.warning("lease scan failed", exc_info=True)
                    continue
                if taken:
                    log.info("took over %d run(s) whose lease had expired", taken)

        self._spawn(loop(), name="recovery")

    async def _recover_one(self, run: RunRecord) -> bool:
        """Take over a run whose process is gone; False when a live process still holds it."""
        async with self._lock(run.thread_id):
            if run.run_id in self._executions:
                return False  # recovered meanwhile (start-up and the lease scan overlap)
            lease = await self.leases.acquire(run.run_id, self._instance_id, self._lease_ttl_s)
            if lease is None:
                return False

            async def mark_recovering(conn: AsyncConnection) -> None:
                if not await RunRepository.transition_in(
                    conn,
                    run.run_id,
                    RunStatus.RECOVERING,
                    expected=(RunStatus.RUNNING, RunStatus.RESUMING, RunStatus.RECOVERING),
                ):
                    raise StaleWrite(run.run_id)

            try:
                await self._log.commit(await self._abort_open_messages(run, lease), mark_recovering)
            except StaleWrite:
                return False
            checkpoint = await self.checkpoints.latest(run.run_id)
            if checkpoint is not None:
                approvals = await self.approvals.for_checkpoint(run.run_id, checkpoint.version)
                await self._continue(run, approvals, EventType.RUN_RECOVERED, checkpoint, lease)
                return True
            graph = self._graph(run.agent)
            if not graph.accepts(run.graph_version):
                raise GraphMismatchError(graph.name, run.graph_version, graph.version)
            await self.sessions.trim(run.thread_id, run.session_mark)

            async def mark_running(conn: AsyncConnection) -> None:
                if not await RunRepository.transition_in(
                    conn, run.run_id, RunStatus.RUNNING, expected=(RunStatus.RECOVERING,)
                ):
                    raise StaleWrite(run.run_id)

            await self._log.commit(
                [
                    self._log.new_event(
                        run.thread_id,
                        run.run_id,
                        EventType.RUN_RECOVERED,
                        {"checkpoint_version": None},
                        lease,
                    )
                ],
                mark_running,
            )
            current = await self.runs.get(run.run_id) or run
            context = graph.make_context() if graph.make_context else None
            self._launch(
                Segment(
                    run=current,
                    graph=graph,
                    agent=self._agent(graph),
                    start=run.input,
                    context=context,
                    lease=lease,
                )
            )
            return True

    async def _abort_open_messages(self, run: RunRecord, lease: Lease) -> list[NewEvent]:
        """`message.aborted` for every message of the run that started and never ended."""
        records = await self.events.for_run(
            run.run_id,
            (
                EventType.MESSAGE_STARTED,
                EventType.MESSAGE_COMPLETED,
                EventType.MESSAGE_ABORTED,
            ),
        )
        open_ids: dict[str, None] = {}
        for record in records:
            message_id = orjson.loads(record.data).get("message_id")
            if record.type == EventType.MESSAGE_STARTED:
                open_ids[message_id] = None
            else:
                open_ids.pop(message_id, None)
        return [
            self._log.new_event(
                run.thread_id,
                run.run_id,
                EventType.MESSAGE_ABORTED,
                {"message_id": message_id, "reason": "gateway_restart"},
                lease,
            )
            for message_id in open_ids
        ]

    # -- views ---------------------------------------------------------------------------

    async def run_view(self, principal: Principal, run_id: str) -> dict[str, Any]:
        run, thread = await self.run_for(principal, run_id)
        try:
            check_can_subscribe(principal, thread_ref(thread))
        except AccessDenied as exc:
            raise denied(exc) from None
        pending = [
            approval_view(a)
            for a in await self.approvals.for_checkpoint(run.run_id, run.checkpoint_version)
            if a.status is ApprovalStatus.PENDING
        ]
        return {
            "run_id": run.run_id,
            "thread_id": run.thread_id,
            "status": run.status.value,
            "agent": run.agent,
            "graph_version": run.graph_version,
            "checkpoint_version": run.checkpoint_version,
            "pending_approvals": pending,
            "error": run.error,
        }

    # -- shutdown ------------------------------------------------------------------------

    async def close(self, grace_s: float = 10.0) -> None:
        """Graceful stop: bring streaming runs to a turn boundary and checkpoint them.

        Each run is suspended with reason "shutdown" and continued by the next process
        (`recover`). Runs that cannot reach a boundary within `grace_s` are cut; they stay
        active in the database and are recovered like after a crash.
        """
        self._closing = True
        for timer in self._suspend_timers.values():
            timer.cancel()
        self._suspend_timers.clear()
        executions = list(self._executions.values())
        for execution in executions:
            execution.request_stop("shutdown")
        if executions:
            await asyncio.wait(
                [asyncio.create_task(e.done.wait()) for e in executions], timeout=grace_s
            )
        tasks = [e.task for e in self._executions.values() if e.task is not None]
        tasks += list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
