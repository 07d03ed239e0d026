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

from gateway.audit import (
    AuditAction,
    Outcome,
    cancellation_entry,
    decision_entry,
    system_entry,
)
from gateway.auth import (
    AccessDenied,
    Principal,
    ThreadRef,
    check_can_act_on_thread,
    check_can_create,
    check_can_decide,
    check_can_subscribe,
)
from gateway.binding import binding_problem, by_call_id
from gateway.bus import EventBus
from gateway.errors import GRAPH_MISMATCH, GatewayError, conflict, not_found, rate_limited
from gateway.eventlog import EventLog
from gateway.execution import Execution, Segment, SegmentRunner, approval_view, storage_retry
from gateway.protocol import ErrorCode, EventType, utc_ts
from gateway.registry import AgentGraph, AgentRegistry, GraphMismatchError, UnknownAgentError
from gateway.review_rules import (
    ReviewContext,
    check_four_eyes,
    check_reviewer_roles,
    decision_rights,
)
from gateway.sensitive import MASK_ALL, masked_call_data, sees_sensitive_arguments
from persistence.approvals import ApprovalRecord, ApprovalRepository, ApprovalStatus
from persistence.audit import AuditEntry, AuditRepository
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


def approval_window_s(approval: ApprovalRecord) -> float:
    """How long the approval could be decided (stored, so a changed TTL does not rewrite it)."""
    if approval.expires_at is None:
        return 0.0
    return round((approval.expires_at - approval.requested_at).total_seconds(), 3)


def expiry_phrase(approval: ApprovalRecord) -> str:
    seconds = approval_window_s(approval)
    unit = "second" if seconds == 1 else "seconds"
    return f"expired after {seconds:g} {unit} without a decision"


def expiry_reason(approval: ApprovalRecord) -> str:
    """What the model is told instead of the tool's output when nobody decided in time."""
    return f"The approval request {expiry_phrase(approval)}."


def settled_message(approval: ApprovalRecord) -> str:
    """Why a decision on an approval that is no longer pending is refused (`conflict`)."""
    if approval.status is ApprovalStatus.EXPIRED:
        return f"approval {expiry_phrase(approval)}"
    if approval.status is ApprovalStatus.SUPERSEDED:
        detail = approval.reason or "the run moved on or was cancelled"
        return f"approval was superseded: {detail}"
    return f"approval already {approval.status.value}"


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
        four_eyes: bool = False,
        approval_ttl_s: float = 0.0,
        approval_sweep_s: float = 5.0,
    ) -> None:
        self._engine = engine
        self._log = log
        self._bus = bus
        self._registry = registry
        self._self_approval = self_approval
        self._four_eyes = four_eyes
        self._approval_ttl_s = approval_ttl_s
        self._approval_sweep_s = approval_sweep_s
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
        admit: Callable[[], None] | None = None,
    ) -> Started:
        """Create a run (and its thread when `thread_id` is None) and start streaming it.

        `admit` is called once the request is known to be valid, right before the run is
        created; it raises (e.g. `rate_limited`) to refuse it.
        """
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
                admit=admit,
                requested_by=principal.user,
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
        admit: Callable[[], None] | None = None,
        requested_by: str | None = None,
    ) -> Started:
        if thread is not None and await self.runs.active_for_thread(thread.thread_id):
            raise conflict("the thread already has an active run; send run.input instead")
        if admit is not None:
            admit()
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
            requested_by=requested_by or owner,
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

    async def submit_input(
        self,
        principal: Principal,
        thread_id: str,
        text: str,
        *,
        admit: Callable[[], None] | None = None,
        max_pending: int = 0,
    ) -> dict[str, Any]:
        """Start a run with `text`, or stage or queue it on the active one.

        `admit` vets a start as in `start_run`; `max_pending` (0: no limit) bounds the inputs
        waiting on the thread, checked in the database so every process sees the same count.
        """
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
                    admit=admit,
                    requested_by=principal.user,
                )
                return {
                    "disposition": "started",
                    "run_id": started.run_id,
                    "first_seq": started.first_seq,
                }
            if max_pending and (
                await self.inputs.count_open(thread_id=thread.thread_id, run_id=run.run_id)
                >= max_pending
            ):
                raise rate_limited(
                    f"the thread already has {max_pending} inputs waiting for the run; "
                    "send more when the run has taken them"
                )
            if run.status in (RunStatus.WAITING_FOR_REVIEW, RunStatus.SUSPENDED):
                await self._check_stageable(run, text)
                await self._record_input(
                    run, text, Disposition.STAGED, EventType.INPUT_STAGED, principal.user
                )
                return {"disposition": "staged", "run_id": run.run_id}
            await self._record_input(
                run, text, Disposition.QUEUED, EventType.INPUT_QUEUED, principal.user
            )
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
        self, run: RunRecord, text: str, disposition: Disposition, event: EventType, sender: str
    ) -> None:
        async def insert(conn: AsyncConnection) -> None:
            await InputRepository.insert_in(
                conn,
                thread_id=run.thread_id,
                run_id=run.run_id,
                text=text,
                disposition=disposition,
                sender=sender,
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
            self._check_review_rules(principal, run, approval, decision)
        except AccessDenied as exc:
            raise denied(exc) from None
        async with self._lock(thread.thread_id):
            run = await self.runs.get(run.run_id) or run
            # Read again under the lock: a decision or an expiry may have landed meanwhile.
            approval = await self._check_decidable(run, approval_id)
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
                # Same transaction: the trail holds exactly the decisions that took effect.
                await AuditRepository.insert_in(
                    conn,
                    decision_entry(
                        principal,
                        approval_id=approval_id,
                        decision=decision,
                        run_id=run.run_id,
                        thread_id=run.thread_id,
                        tool_name=approval.tool_name,
                        arguments_digest=approval.arguments_digest,
                        has_reason=bool(reason),
                    ),
                )

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

    def _check_review_rules(
        self, principal: Principal, run: RunRecord, approval: ApprovalRecord, decision: str
    ) -> None:
        """Per-tool reviewer roles and four-eyes (gateway/review_rules.py): AccessDenied."""
        review = self._review_context(run, approval.tool_name, self._graph(run.agent))
        check_reviewer_roles(principal, approval.tool_name, review.reviewer_roles)
        check_four_eyes(principal, review.requested_by, decision, enabled=self._four_eyes)

    def _review_context(
        self, run: RunRecord, tool_name: str, graph: AgentGraph | None = None
    ) -> ReviewContext:
        if graph is None:
            try:
                graph = self._registry.get(run.agent)
            except UnknownAgentError:
                graph = None  # the run cannot continue anyway; nobody is singled out
        return ReviewContext(
            reviewer_roles=graph.roles_for(tool_name) if graph else frozenset(),
            # Runs from before requesters were recorded: their owner asked for them.
            requested_by=run.requested_by or run.owner,
        )

    async def _check_decidable(self, run: RunRecord, approval_id: str) -> ApprovalRecord:
        """The approval, if a decision may be recorded on it now (caller holds the thread lock).

        Otherwise raises `conflict`, after settling what the refusal found: an approval left
        pending by a run that moved on, or whose call in the checkpoint is not the one that
        was displayed (gateway/binding.py), is marked superseded; one past its `expires_at`
        is expired exactly as the sweeper would have done.
        """
        approval = await self.approvals.get(approval_id)
        if approval is None:
            raise not_found("approval not found")
        if approval.status is not ApprovalStatus.PENDING:
            raise conflict(settled_message(approval))
        if run.status.terminal or run.checkpoint_version != approval.checkpoint_version:
            await self._supersede(run, [approval_id], "the run moved on before a decision")
            raise conflict("approval was superseded: the run has moved on")
        if run.status is not RunStatus.WAITING_FOR_REVIEW:
            raise conflict("approval was superseded: the run has moved on")
        if approval.expires_at is not None and utcnow() >= approval.expires_at:
            await self._expire_locked(run, approval)
            raise conflict(f"approval {expiry_phrase(approval)}")
        checkpoint = await self.checkpoints.latest(run.run_id)
        if checkpoint is None:
            raise conflict("the run has no checkpoint")
        # Refuse before recording anything: a decision on a run that cannot be restored
        # would otherwise leave it stuck half-decided.
        graph = self._graph_for_checkpoint(run, checkpoint)
        problem = (
            "the run's checkpoint is not the one the approval was requested at"
            if checkpoint.version != approval.checkpoint_version
            else await self._binding_problem(graph, checkpoint, approval)
        )
        if problem is not None:
            log.warning("approval %s refused and superseded: %s", approval_id, problem)
            await self._supersede(run, [approval_id], f"not bound to its call: {problem}")
            # Without it the pause may be fully decided: the continuation then meets the
            # call again, undecided, and the SDK asks anew, so a fresh approval shows the
            # call as it really is.
            self._spawn(self._continue_when_decided(run), name=f"continue-{run.run_id}")
            raise conflict(f"approval was superseded: {problem}")
        return approval

    async def _binding_problem(
        self, graph: AgentGraph, checkpoint: CheckpointRecord, approval: ApprovalRecord
    ) -> str | None:
        """Restore the checkpoint and compare its call with what the approval displayed."""
        state = await RunState.from_string(
            self._agent(graph), checkpoint.state, context_deserializer=graph.context_deserializer
        )
        calls = by_call_id(state.get_interruptions())
        return binding_problem(approval, calls.get(approval.call_id))

    async def _supersede(self, run: RunRecord, approval_ids: list[str], reason: str) -> None:
        removed: list[str] = []

        async def mark(conn: AsyncConnection) -> None:
            removed.extend(await ApprovalRepository.supersede_in(conn, approval_ids, reason=reason))

        await self._log.commit((), mark)
        if removed:
            self._bus.publish_inbox(run.tenant, removed=removed)

    # -- expiry (GATEWAY_APPROVAL_TTL_S) -------------------------------------------------

    async def _expire_locked(self, run: RunRecord, approval: ApprovalRecord) -> bool:
        """Reject an approval past its `expires_at` on behalf of the system (caller holds the
        thread lock); the run then continues as after a reject. False if it was settled first.
        """
        now = utcnow()
        reason = expiry_reason(approval)

        async def record(conn: AsyncConnection) -> None:
            if not await ApprovalRepository.expire_in(
                conn,
                approval.approval_id,
                reason=reason,
                checkpoint_version=approval.checkpoint_version,
                decided_at=now,
            ):
                raise StaleWrite(approval.approval_id)
            # Same transaction as the expiry, like a reviewer's decision.
            await AuditRepository.insert_in(
                conn,
                system_entry(
                    AuditAction.APPROVAL_EXPIRED,
                    tenant=run.tenant,
                    target=approval.approval_id,
                    details={
                        "run_id": run.run_id,
                        "thread_id": run.thread_id,
                        "tool_name": approval.tool_name,
                        "arguments_digest": approval.arguments_digest,
                        "ttl_s": approval_window_s(approval),
                    },
                ),
            )

        event = self._log.new_event(
            run.thread_id,
            run.run_id,
            EventType.APPROVAL_DECIDED,
            {
                "approval_id": approval.approval_id,
                "decision": "reject",
                "reason": reason,
                "reviewer": None,
                "decided_at": utc_ts(now),
                "expired": True,
            },
        )
        try:
            await self._log.commit([event], record)
        except StaleWrite:
            return False
        log.info("approval %s of run %s expired", approval.approval_id, run.run_id)
        self._bus.publish_inbox(run.tenant, removed=[approval.approval_id])
        self._spawn(self._continue_when_decided(run), name=f"continue-{run.run_id}")
        return True

    async def expire_due(self) -> int:
        """Expire every pending approval past its `expires_at`; returns how many expired.

        Approvals of runs that moved on meanwhile are superseded instead: nobody can decide
        them any more, so nothing is rejected on anyone's behalf.
        """
        expired = 0
        for due in await self.approvals.expired_pending(utcnow()):
            try:
                async with self._lock(due.thread_id):
                    approval = await self.approvals.get(due.approval_id)
                    run = await self.runs.get(due.run_id)
                    if approval is None or run is None:
                        continue
                    if approval.status is not ApprovalStatus.PENDING:
                        continue
                    if run.status.terminal or run.checkpoint_version != approval.checkpoint_version:
                        await self._supersede(run, [approval.approval_id], "the run moved on")
                    elif run.status is RunStatus.WAITING_FOR_REVIEW:
                        expired += await self._expire_locked(run, approval)
            except StorageUnavailable:
                raise
            except Exception:
                log.error("expiring approval %s failed", due.approval_id, exc_info=True)
        return expired

    def start_expiry(self) -> None:
        """Sweep for expired approvals every `approval_sweep_s`, when approvals expire at all.

        A decision arriving after `expires_at` is refused (and expires the approval) whether
        or not the sweep has run, so the sweep only bounds how late an unattended expiry is.
        """
        if self._approval_ttl_s <= 0:
            return

        async def loop() -> None:
            while not self._closing:
                await asyncio.sleep(self._approval_sweep_s)
                try:
                    await self.expire_due()
                except Exception:
                    log.warning("approval expiry sweep failed", exc_info=True)

        self._spawn(loop(), name="approval-expiry")

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
        by_call = by_call_id(state.get_interruptions())
        known_calls: dict[str, str] = {}
        # Approved, but not for the call as it stands in the checkpoint: never applied.
        unbound: list[str] = []
        for approval in approvals:
            item = by_call.get(approval.call_id)
            if item is None:
                continue
            known_calls[approval.call_id] = approval.tool_name
            if approval.status is ApprovalStatus.APPROVED:
                problem = binding_problem(approval, item)
                if problem is not None:
                    # Left undecided, the call pauses the run again with a fresh approval.
                    log.warning("approval %s not applied: %s", approval.approval_id, problem)
                    unbound.append(approval.approval_id)
                    continue
                state.approve(item)
            elif approval.status in (ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED):
                # The reason is exactly what the model is told; without one the SDK's default.
                # An expiry is a reject by the system, with the expiry as its reason.
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
        superseded: list[str] = []

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
            await ApprovalRepository.supersede_in(
                conn, unbound, reason="not bound to its call: the checkpoint's call differs"
            )
            # Whatever is still pending belongs to a pause this continuation leaves behind
            # (a recovery from a newer checkpoint): nobody can decide it any more.
            superseded.extend(await ApprovalRepository.supersede_pending_in(conn, run.run_id))
            return held

        held, _ = await self._log.commit(
            [self._log.new_event(run.thread_id, run.run_id, announce, data, lease)], mark_running
        )
        if superseded:
            self._bus.publish_inbox(run.tenant, removed=superseded)
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
            entry = cancellation_entry(
                principal, run_id=run.run_id, thread_id=run.thread_id, status=run.status.value
            )
            execution = self._executions.get(run_id)
            if execution is None:
                await self._cancel_idle(run, entry)
                return
            execution.cancel_requested = True
            # Written by the segment with its `run.cancelled`. A second cancel of the same
            # run while the first is in flight adds nothing: the first one is recorded.
            if execution.cancel_audit is None:
                execution.cancel_audit = entry
            if execution.result is not None:
                execution.result.cancel("immediate")
        await execution.done.wait()
        if execution.cancel_audit is entry:
            # The run ended some other way before the cancel took hold: say so.
            ended = await self.runs.get(run_id)
            await AuditRepository(self._engine).insert(
                cancellation_entry(
                    principal,
                    run_id=run.run_id,
                    thread_id=run.thread_id,
                    status=ended.status.value if ended else run.status.value,
                    outcome=Outcome.FAILED,
                )
            )

    async def _cancel_idle(self, run: RunRecord, audit: AuditEntry) -> None:
        removed: list[str] = []

        async def transition(conn: AsyncConnection) -> None:
            moved = await RunRepository.transition_in(
                conn, run.run_id, RunStatus.CANCELLED, expected=ACTIVE
            )
            if not moved:
                raise StaleWrite(run.run_id)
            removed.extend(await ApprovalRepository.supersede_pending_in(conn, run.run_id))
            await AuditRepository.insert_in(conn, audit)

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
                    # Inputs queued before migration 0005 have no sender: the owner stands in.
                    requested_by=nxt.sender or thread.owner,
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
            self._approval_view_of_run(principal, a, run)
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

    async def inbox_views(self, principal: Principal) -> list[dict[str, Any]]:
        """The tenant's pending approvals for an inbox reader (a reviewer or admin), each with
        who may decide it and what this reader may do with it."""
        pending = await self.approvals.pending_for_tenant(principal.tenant)
        runs: dict[str, RunRecord | None] = {}
        views = []
        for approval in pending:
            if approval.run_id not in runs:
                runs[approval.run_id] = await self.runs.get(approval.run_id)
            run = runs[approval.run_id]
            review = self._review_context(run, approval.tool_name) if run else None
            views.append(approval_view(approval, review))
        return self.for_inbox_reader(principal, views)

    def for_inbox_reader(
        self, principal: Principal, views: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Add `can_decide` / `can_approve` for this reader to views that carry the review
        fields (`reviewer_roles`, `requested_by`); the views are shared, so they are copied."""
        return [decision_rights(principal, view, four_eyes=self._four_eyes) for view in views]

    async def view_approval(self, principal: Principal, approval: ApprovalRecord) -> dict[str, Any]:
        """The approval as this caller may see it: sensitive arguments masked for anyone who
        is not a reviewer or admin (a self-approving owner, for example)."""
        if sees_sensitive_arguments(principal):
            return approval_view(approval)
        run = await self.runs.get(approval.run_id)
        if run is None:
            return masked_call_data(approval_view(approval), approval.tool_name, MASK_ALL)
        return self._approval_view_of_run(principal, approval, run)

    def _approval_view_of_run(
        self, principal: Principal, approval: ApprovalRecord, run: RunRecord
    ) -> dict[str, Any]:
        view = approval_view(approval, self._review_context(run, approval.tool_name))
        if sees_sensitive_arguments(principal):
            return view
        try:
            sensitive = self._registry.get(run.agent).sensitive_arguments
        except UnknownAgentError:
            # The graph that knew what is sensitive is gone: hide every argument.
            return masked_call_data(view, approval.tool_name, MASK_ALL)
        return masked_call_data(view, approval.tool_name, sensitive)

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
