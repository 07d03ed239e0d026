"""RunManager: the run lifecycle (docs/protocol.md §1, docs/architecture.md "Components").

start -> running -> (waiting_for_review -> resuming -> running)* -> completed | failed | cancelled,
plus recovering after a crash. Every state change is a compare-and-swap in the database, made in
the same transaction as the event that announces it; per-thread locks serialise this process's
own decisions about one thread (start, input, decide, cancel, finish) so none is lost between a
read and a write.

This module starts runs, takes their input, cancels, suspends and resumes them, starts the next
queued input when one ends, and stops them on shutdown. It composes the other parts, which
share its `RunContext` (gateway/run_lifecycle/context.py): deciding approvals
(gateway/run_lifecycle/decisions.py), continuing from a checkpoint
(gateway/run_lifecycle/continuation.py), recovery and the lease scan
(gateway/run_lifecycle/recovery.py), and the views readers get
(gateway/run_lifecycle/read_views.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gateway.agents.registry import AgentGraph, AgentRegistry
from gateway.agents.run_caller import caller_of, stored_caller
from gateway.auth.access import check_can_act_on_thread, check_can_create, check_can_subscribe
from gateway.auth.audit_trail import Outcome, answered_again_entry, cancellation_entry
from gateway.event_log.bus import EventBus
from gateway.event_log.writer import EventLog
from gateway.observability.metrics import GatewayMetrics
from gateway.protocol.error_codes import ErrorCode, GatewayError, conflict, not_found, rate_limited
from gateway.protocol.frames import EventType
from gateway.protocol.identity import Principal
from gateway.run_lifecycle.cancellation import cancel_unstreamed
from gateway.run_lifecycle.context import RunContext, thread_ref
from gateway.run_lifecycle.continuation import Continuer
from gateway.run_lifecycle.decisions import Decisions
from gateway.run_lifecycle.execution import Segment, SegmentRunner
from gateway.run_lifecycle.read_views import Views
from gateway.run_lifecycle.recovery import Recovery
from gateway.run_lifecycle.restored_checkpoints import restore_state
from gateway.run_lifecycle.retry import Retries
from gateway.run_lifecycle.started import Started
from gateway.run_lifecycle.thread_list import ThreadList
from gateway.run_lifecycle.thread_titles import default_title
from gateway.storage.health import log_failure
from persistence.audit import AuditEntry, AuditRepository
from persistence.checkpoints import CheckpointRecord
from persistence.clock import utcnow
from persistence.errors import StaleWrite, StorageUnavailable
from persistence.events import EventRepository
from persistence.ids import new_id
from persistence.inputs import Disposition, InputRepository
from persistence.leases import Lease, LeaseRepository
from persistence.run_status import RunStatus

# RunRecord and ThreadRecord re-exported: the records the transports read, so that they need
# not import persistence.
from persistence.runs import RunRecord as RunRecord
from persistence.runs import RunRepository
from persistence.session_marks import SessionMarks
from persistence.store import Store
from persistence.threads import ThreadRecord as ThreadRecord
from persistence.threads import ThreadRepository

log = logging.getLogger(__name__)

# Times a cancel goes after a run that keeps ending its segments some other way (each pause
# caught mid-store moves it once) before the canceller hears `conflict` and tries again.
CANCEL_ATTEMPTS = 3


class RunManager:
    def __init__(
        self,
        *,
        store: Store,
        log: EventLog,
        bus: EventBus,
        registry: AgentRegistry,
        segments_factory: Callable[..., SegmentRunner],
        self_approval: bool,
        suspend_grace_s: float = 15.0,
        instance_id: str = "gateway",
        incarnation: str | None = None,
        lease_ttl_s: float = 15.0,
        lease_scan_s: float | None = None,
        four_eyes: bool = False,
        approval_ttl_s: float = 0.0,
        approval_sweep_s: float = 5.0,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        segments = segments_factory(
            on_inbox_added=self._inbox_added,
            on_finished=self._finished,
            on_suspended=self._suspended,
            on_paused=self._paused,
            self_approval=self_approval,
        )
        self._ctx = ctx = RunContext(
            store=store,
            log=log,
            bus=bus,
            registry=registry,
            segments=segments,
            instance_id=instance_id,
            incarnation=incarnation,
            lease_ttl_s=lease_ttl_s,
            metrics=metrics,
        )
        self._continuer = Continuer(ctx)
        self.decisions = Decisions(
            ctx,
            self._continuer,
            self_approval=self_approval,
            four_eyes=four_eyes,
            approval_ttl_s=approval_ttl_s,
            approval_sweep_s=approval_sweep_s,
        )
        self.recovery = Recovery(ctx, self._continuer, lease_scan_s)
        self.views = Views(ctx, four_eyes=four_eyes, self_approval=self_approval)
        self.retries = Retries(ctx)
        self.thread_list = ThreadList(ctx)
        # Read by the transports: a thread's head and epoch, an approval's real arguments.
        self.threads = ctx.threads
        self.approvals = ctx.approvals
        self._suspend_grace_s = suspend_grace_s
        self._suspend_timers: dict[str, asyncio.TimerHandle] = {}
        bus.on_watchers_changed(self._watchers_changed)
        bus.on_remote_inbox(self._remote_inbox)
        bus.on_message("revoked", self._revoked_elsewhere)
        bus.on_message("handover", self._handed_over)
        # Inbox changes from other processes are delivered in the order they arrived, each
        # after its rows were read.
        self._remote_inbox_turn = asyncio.Lock()

    def is_executing(self, run_id: str) -> bool:
        return self._ctx.is_executing(run_id)

    def starting_agent(self, graph: AgentGraph) -> Any:
        """The graph's built starting agent, the one its runs use (built once per version)."""
        return self._ctx.agent(graph)

    # -- threads -------------------------------------------------------------------------

    async def create_thread(
        self, principal: Principal, metadata: dict[str, Any] | None
    ) -> ThreadRecord:
        check_can_create(principal)
        return await self._ctx.threads.create(
            tenant=principal.tenant, owner=principal.user, metadata=metadata
        )

    async def authorize_subscribe(
        self, principal: Principal, thread_id: str, known: ThreadRecord | None = None
    ) -> ThreadRecord:
        """The thread, if `principal` may watch it. `known`: the thread as just read or
        written by this process (a run start), checked without reading it again."""
        if known is not None and known.thread_id == thread_id:
            thread = known
            if thread.tenant != principal.tenant:
                raise not_found("thread not found")
        else:
            thread = await self._ctx.thread_for(principal, thread_id)
        check_can_subscribe(principal, thread_ref(thread))
        return thread

    async def active_run(self, thread_id: str) -> RunRecord | None:
        return await self._ctx.runs.active_for_thread(thread_id)

    async def runs_of_thread(self, thread_id: str, limit: int = 1000) -> list[RunRecord]:
        """The thread's newest `limit` runs, oldest first."""
        return await self._ctx.runs.of_thread(thread_id, limit)

    async def first_seq(self, thread_id: str, run_id: str) -> int | None:
        """The seq of the run's `run.started`: where everything the run logged begins."""
        started = await EventRepository(self._ctx.store).for_run(
            thread_id, run_id, [EventType.RUN_STARTED]
        )
        return started[0].seq if started else None

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
        create_missing: bool = False,
    ) -> Started:
        """Create a run (and its thread when `thread_id` is None) and start streaming it.

        `admit` is called once the request is known to be valid, right before the run is
        created; it raises (e.g. `rate_limited`) to refuse it. `create_missing`: a
        `thread_id` unknown in the caller's tenant names a new thread the caller owns (the
        frontend adapters, whose clients choose a conversation's id before it exists).
        """
        if self._ctx.closing:
            raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
        graph = self._ctx.graph(agent)
        thread: ThreadRecord | None = None
        new_thread_id: str | None = None
        if thread_id is not None:
            thread = await self._ctx.threads.get(thread_id)
            if thread is not None and thread.tenant != principal.tenant:
                raise not_found("thread not found")
            if thread is None and not create_missing:
                raise not_found("thread not found")
            if thread is None and await self._ctx.threads.get_many([thread_id]):
                # A deleted thread: its id is never used again.
                raise not_found("thread not found")
        if thread is None:
            check_can_create(principal)
            new_thread_id = thread_id
            key = thread_id or new_id("t")  # a lock key nobody else can hold
        else:
            check_can_act_on_thread(principal, thread_ref(thread))
            key = thread.thread_id
        async with self._ctx.lock(key):
            return await self._start_locked(
                principal.tenant,
                principal.user,
                thread,
                graph,
                text,
                on_disconnect,
                admit=admit,
                requested_by=principal.user,
                caller=stored_caller(principal, graph.context_claims),
                new_thread_id=new_thread_id,
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
        caller: dict[str, Any] | None = None,
        new_thread_id: str | None = None,
        supersedes: RunRecord | None = None,
        regenerated_by: Principal | None = None,
    ) -> Started:
        """`supersedes`: the thread's last run, whose answer this run replaces (regenerate,
        asked for by `regenerated_by`): the conversation's history goes back to where that run
        began, in the run's own transaction, which also audits it."""
        if thread is not None and await self._ctx.runs.active_for_thread(thread.thread_id):
            raise conflict("the thread already has an active run; send run.input instead")
        if admit is not None:
            admit()
        run_id = new_id("r")
        # A new thread is made here and inserted by the run's transaction.
        created = (
            ThreadRecord.new(
                tenant=tenant,
                owner=owner,
                metadata=None,
                thread_id=new_thread_id,
                title=default_title(text),
            )
            if thread is None
            else None
        )
        base = created or thread
        assert base is not None
        thread_id = base.thread_id
        now = utcnow()
        # The session mark of an existing thread is read in the run's own transaction.
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
            session_mark=0,
            error=None,
            created_at=now,
            updated_at=now,
            requested_by=requested_by or owner,
            caller=caller,
        )

        instance_id, ttl_s = self._ctx.instance_id, self._ctx.lease_ttl_s

        def insert(conn: Connection) -> tuple[Lease, int]:
            mark = 0
            if created is not None:
                ThreadRepository.insert_in(conn, created)
            else:
                if supersedes is not None:
                    SessionMarks.trim_in(conn, thread_id, supersedes.session_mark)
                    if regenerated_by is not None:
                        entry = answered_again_entry(
                            regenerated_by,
                            run_id=run_id,
                            thread_id=thread_id,
                            supersedes=supersedes.run_id,
                        )
                        AuditRepository.insert_in(conn, entry)
                mark = SessionMarks.head_in(conn, thread_id)
                if base.title is None:
                    ThreadRepository.name_first_in(conn, thread_id, default_title(text))
            lease = RunRepository.insert_leased_in(
                conn, replace(record, session_mark=mark), instance_id, ttl_s
            )
            if consumed_input_id is not None:
                InputRepository.consume_in(conn, [consumed_input_id], run_id=run_id)
            return lease, mark

        data: dict[str, Any] = {"input": text, "agent": graph.name}
        if supersedes is not None:
            data["supersedes"] = supersedes.run_id
        started = self._ctx.log.new_event(thread_id, run_id, EventType.RUN_STARTED, data)
        try:
            (lease, mark), logged = await self._ctx.log.commit([started], insert, agent=graph.name)
        except IntegrityError:
            if created is not None and new_thread_id is not None:
                # A thread of that id appeared meanwhile: a concurrent first request, or
                # another tenant's thread (ids are unique across tenants).
                raise conflict("a thread of that id was created meanwhile; try again") from None
            # The partial unique index on active runs: another process won the race.
            raise conflict("the thread already has an active run; send run.input instead") from None
        record = replace(record, session_mark=mark)
        agent = self._ctx.agent(graph)
        run_caller = caller_of(record)
        self._ctx.launch(
            Segment(
                run=record,
                graph=graph,
                agent=agent,
                start=text,
                caller=run_caller,
                context=graph.new_context(run_caller),
                lease=lease,
                thread_created=created is not None,
            )
        )
        first_seq = logged[0].seq
        known = replace(base, head_seq=logged[-1].seq)
        return Started(
            thread_id=thread_id,
            run_id=run_id,
            first_seq=first_seq,
            thread=known,
            events=logged,
            supersedes=supersedes.run_id if supersedes is not None else None,
            quiet_since=self._ctx.bus.publications if created is not None else None,
        )

    async def regenerate(
        self,
        principal: Principal,
        thread_id: str,
        *,
        text: str | None = None,
        supersedes: str | None = None,
        admit: Callable[[], None] | None = None,
    ) -> Started:
        """A new answer to the thread's last input (`text`: an edited input instead), in a new
        run that supersedes the last one. The log keeps the earlier answer (`run.started`
        says which run it supersedes); the history the agent sees goes back to where that run
        began. Only the last run can be superseded, and only once it has finished.
        `supersedes`: the run the caller means, refused when it is not the last one."""
        if self._ctx.closing:
            raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
        thread = await self._ctx.thread_for(principal, thread_id)
        check_can_act_on_thread(principal, thread_ref(thread))
        async with self._ctx.lock(thread.thread_id):
            if await self._ctx.runs.active_for_thread(thread.thread_id) is not None:
                raise conflict("the thread's run is still active; stop it first")
            runs = await self._ctx.runs.of_thread(thread.thread_id, limit=1)
            if not runs:
                raise conflict("the thread has no answer to regenerate")
            last = runs[-1]
            if supersedes is not None and supersedes != last.run_id:
                raise conflict("only the thread's last answer can be regenerated or edited")
            graph = self._ctx.graph(last.agent)
            return await self._start_locked(
                principal.tenant,
                thread.owner,
                thread,
                graph,
                last.input if text is None else text,
                "continue",
                admit=admit,
                requested_by=principal.user,
                caller=stored_caller(principal, graph.context_claims),
                supersedes=last,
                regenerated_by=principal,
            )

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
        thread = await self._ctx.thread_for(principal, thread_id)
        check_can_act_on_thread(principal, thread_ref(thread))
        async with self._ctx.lock(thread.thread_id):
            run = await self._ctx.runs.active_for_thread(thread.thread_id)
            if run is None:
                if self._ctx.closing:
                    raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
                graph = self._ctx.graph(None)
                started = await self._start_locked(
                    principal.tenant,
                    thread.owner,
                    thread,
                    graph,
                    text,
                    "continue",
                    admit=admit,
                    requested_by=principal.user,
                    caller=stored_caller(principal, graph.context_claims),
                )
                return {
                    "disposition": "started",
                    "run_id": started.run_id,
                    "first_seq": started.first_seq,
                }
            if max_pending and (
                await self._ctx.inputs.count_open(thread_id=thread.thread_id, run_id=run.run_id)
                >= max_pending
            ):
                if self._ctx.metrics is not None:
                    self._ctx.metrics.refused("pending_inputs")
                raise rate_limited(
                    f"the thread already has {max_pending} inputs waiting for the run; "
                    "send more when the run has taken them"
                )
            if run.status in (RunStatus.WAITING_FOR_REVIEW, RunStatus.SUSPENDED):
                await self._check_stageable(run, text)
                await self._record_input(
                    run, text, Disposition.STAGED, EventType.INPUT_STAGED, principal
                )
                return {"disposition": "staged", "run_id": run.run_id}
            await self._record_input(
                run, text, Disposition.QUEUED, EventType.INPUT_QUEUED, principal
            )
            return {"disposition": "queued", "run_id": run.run_id}

    async def _check_stageable(self, run: RunRecord, text: str) -> None:
        """Ask the SDK whether the paused state accepts input, on a throwaway restore."""
        checkpoint = await self._ctx.checkpoints.latest(run.run_id)
        if checkpoint is None:
            raise conflict("the run has no checkpoint to stage input on")
        graph = self._ctx.graph_for_checkpoint(run, checkpoint)
        state = await restore_state(checkpoint, graph, self._ctx.agent(graph))
        try:
            state.add_input(text)
        except Exception as exc:
            raise conflict(f"the paused run cannot take input now: {exc}") from None

    async def _record_input(
        self,
        run: RunRecord,
        text: str,
        disposition: Disposition,
        event: EventType,
        sender: Principal,
    ) -> None:
        # A queued input starts a run of the default graph (`_start_next_queued`) for its
        # sender, whose token is gone by then: what its context needs of it is kept now.
        caller = stored_caller(sender, self._ctx.graph(None).context_claims)

        def insert(conn: Connection) -> None:
            InputRepository.insert_in(
                conn,
                thread_id=run.thread_id,
                run_id=run.run_id,
                text=text,
                disposition=disposition,
                sender=sender.user,
                caller=caller,
            )

        await self._ctx.log.commit(
            [self._ctx.log.new_event(run.thread_id, run.run_id, event, {"input": text})], insert
        )

    # -- cancel and resume ---------------------------------------------------------------

    async def cancel(self, principal: Principal, run_id: str) -> None:
        """Cancel the run; returns once `run.cancelled` is stored (docs/protocol.md §4
        `run.cancel`). A segment already storing its end when the cancel reaches it (its
        pause, its completion) can no longer take it: the cancel then goes on to what the run
        became, a paused run cancelled as such, a finished one a `conflict`."""
        run, thread = await self._ctx.run_for(principal, run_id)
        check_can_act_on_thread(principal, thread_ref(thread))
        for _ in range(CANCEL_ATTEMPTS):
            async with self._ctx.lock(thread.thread_id):
                run = await self._ctx.runs.get(run_id) or run
                if run.status.terminal:
                    raise conflict(f"run already {run.status.value}")
                entry = cancellation_entry(
                    principal, run_id=run.run_id, thread_id=run.thread_id, status=run.status.value
                )
                execution = self._ctx.executions.get(run_id)
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
            ended = await self._ctx.runs.get(run_id)
            if ended is None or ended.status is RunStatus.CANCELLED:
                return
            if execution.cancel_audit is entry:
                execution.cancel_audit = None
            if ended.status.terminal:
                # The run ended some other way before the cancel took hold: say so.
                await AuditRepository(self._ctx.store).insert(
                    cancellation_entry(
                        principal,
                        run_id=run.run_id,
                        thread_id=run.thread_id,
                        status=ended.status.value,
                        outcome=Outcome.FAILED,
                    )
                )
                raise conflict(f"run already {ended.status.value}")
        raise conflict("the run changed while cancelling; try again")

    async def _cancel_idle(self, run: RunRecord, audit: AuditEntry) -> None:
        try:
            await cancel_unstreamed(self._ctx.log, self._ctx.bus, run, audit)
        except StaleWrite:
            raise conflict("the run changed while cancelling; try again") from None
        self._ctx.spawn(self._start_next_queued(run.thread_id), name="next-queued")

    def _handed_over(self, message: dict[str, Any]) -> None:
        """Another process, shutting down, left these runs for the others to continue now."""
        run_ids = [str(run_id) for run_id in message.get("run_ids", [])]
        if run_ids and not self._ctx.closing:
            self._ctx.spawn(self.recovery.take_over(run_ids), name="take-over")

    def _revoked_elsewhere(self, message: dict[str, Any]) -> None:
        """Another process cancelled a run this one streams: its writes are refused from now
        on (the lease was revoked with the cancel), so stop the stream without waiting."""
        run_id = str(message.get("run_id"))
        execution = self._ctx.executions.get(run_id)
        if execution is not None and execution.result is not None:
            log.info("run %s was cancelled through another process; stopping it", run_id)
            execution.result.cancel("immediate")

    async def resume(self, principal: Principal, run_id: str) -> None:
        run, thread = await self._ctx.run_for(principal, run_id)
        check_can_act_on_thread(principal, thread_ref(thread))
        async with self._ctx.lock(thread.thread_id):
            run = await self._ctx.runs.get(run_id) or run
            if run.status is not RunStatus.SUSPENDED:
                raise conflict(f"run is {run.status.value}, not suspended")
            await self._continuer.resume_suspended(run)

    # -- watchers (on_disconnect "suspend") ----------------------------------------------

    def _watchers_changed(self, thread_id: str, watchers: int) -> None:
        timer = self._suspend_timers.pop(thread_id, None)
        if timer is not None:
            timer.cancel()
        if self._ctx.closing:
            return
        execution = next(
            (e for e in self._ctx.executions.values() if e.thread_id == thread_id), None
        )
        if watchers == 1 and execution is None:
            # A run this process streams is not suspended (and one that is being suspended
            # right now checks for watchers itself, `_suspended`): only otherwise look.
            self._ctx.spawn(self._resume_on_watch(thread_id), name=f"resume-on-watch-{thread_id}")
        if watchers > 0:
            return
        if execution is None or execution.on_disconnect != "suspend":
            return
        self._suspend_timers[thread_id] = asyncio.get_running_loop().call_later(
            self._suspend_grace_s, self._suspend_unwatched, thread_id
        )

    def _suspend_unwatched(self, thread_id: str) -> None:
        self._suspend_timers.pop(thread_id, None)
        bus = self._ctx.bus
        if bus.watchers(thread_id):
            return
        if bus.watched(thread_id):
            # Watched through another process: look again after another grace period.
            self._suspend_timers[thread_id] = asyncio.get_running_loop().call_later(
                self._suspend_grace_s, self._suspend_unwatched, thread_id
            )
            return
        for execution in self._ctx.executions.values():
            if execution.thread_id == thread_id and execution.on_disconnect == "suspend":
                execution.request_stop("disconnect")

    async def _suspended(self, run: RunRecord, reason: str) -> None:
        """A watcher may have arrived after the grace timer fired: continue at once then."""
        if reason == "disconnect" and self._ctx.bus.watched(run.thread_id):
            self._ctx.spawn(self._resume_on_watch(run.thread_id), name=f"resume-{run.run_id}")

    async def _resume_on_watch(self, thread_id: str) -> None:
        """A new watcher on a thread continues its suspended run (docs/protocol.md §6)."""
        try:
            async with self._ctx.lock(thread_id):
                run = await self._ctx.runs.active_for_thread(thread_id)
                if run is not None and run.status is RunStatus.SUSPENDED:
                    await self._continuer.resume_suspended(run)
        except Exception as exc:
            log_failure(log, exc, "resuming the suspended run of thread %s failed", thread_id)

    # -- endings -------------------------------------------------------------------------

    def _paused(self, checkpoint: CheckpointRecord, graph: AgentGraph) -> None:
        if not self._ctx.closing:
            self._ctx.restored.prepare(checkpoint, graph)

    def _inbox_added(self, tenant: str, views: list[dict[str, Any]]) -> None:
        self._ctx.requested(views)
        self._ctx.bus.publish_inbox(tenant, added=views)

    def _remote_inbox(self, tenant: str, added: list[str], removed: list[str]) -> None:
        self._ctx.spawn(self._deliver_remote_inbox(tenant, added, removed), name="remote-inbox")

    async def _deliver_remote_inbox(
        self, tenant: str, added: list[str], removed: list[str]
    ) -> None:
        async with self._remote_inbox_turn:
            try:
                views = await self.views.pending_views(tenant, added) if added else []
            except StorageUnavailable:
                log.warning("inbox change from another process not shown: storage unavailable")
                return
            self._ctx.bus.deliver_inbox(tenant, views, removed)

    async def _finished(self, run: RunRecord, status: RunStatus) -> None:
        if status is RunStatus.CANCELLED:
            self._ctx.bus.publish_inbox(
                run.tenant,
                removed=[
                    a.approval_id
                    for a in await self._ctx.approvals.for_checkpoint(
                        run.run_id, run.checkpoint_version
                    )
                ],
            )
        self._ctx.spawn(self._start_next_queued(run.thread_id), name="next-queued")

    async def _start_next_queued(self, thread_id: str) -> None:
        if self._ctx.closing:
            return
        async with self._ctx.lock(thread_id):
            # Queued input first: there usually is none, and then that one read is all.
            queued = await self._ctx.inputs.open(
                thread_id=thread_id, disposition=Disposition.QUEUED
            )
            if not queued or await self._ctx.runs.active_for_thread(thread_id):
                return
            thread = await self._ctx.threads.get(thread_id)
            if thread is None:
                return
            nxt = queued[0]
            try:
                await self._start_locked(
                    thread.tenant,
                    thread.owner,
                    thread,
                    self._ctx.graph(None),
                    nxt.input,
                    "continue",
                    consumed_input_id=nxt.input_id,
                    # Inputs queued before migration 0005 have no sender: the owner stands in.
                    requested_by=nxt.sender or thread.owner,
                    caller=nxt.caller,
                )
            except GatewayError as exc:
                if exc.fault:
                    raise
                log.warning(
                    "could not start the queued input of thread %s", thread_id, exc_info=True
                )

    # -- shutdown ------------------------------------------------------------------------

    async def close(self, grace_s: float = 10.0) -> None:
        """Graceful stop: bring streaming runs to a turn boundary and checkpoint them.

        Each run is suspended with reason "shutdown". Runs that cannot reach a boundary within
        `grace_s` are cut; they stay active in the database and are recovered like after a
        crash. Then the leases still held are released and, over a shared bus, the runs handed
        over: another process continues them at once (`Recovery.take_over`); otherwise the next
        start of a process does (`Recovery.recover`), or, for cut runs, the lease scan of
        another.
        """
        self._ctx.closing = True
        for timer in self._suspend_timers.values():
            timer.cancel()
        self._suspend_timers.clear()
        executions = list(self._ctx.executions.values())
        for execution in executions:
            execution.request_stop("shutdown")
        if executions:
            await asyncio.wait(
                [asyncio.create_task(e.done.wait()) for e in executions], timeout=grace_s
            )
        # Those that reached no turn boundary within the grace: cut below.
        cut = [e.run_id for e in executions if not e.done.is_set()]
        tasks = [e.task for e in self._ctx.executions.values() if e.task is not None]
        tasks += list(self._ctx.background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._ctx.segments.close()
        if executions:
            run_ids = [e.run_id for e in executions]
            log.info(
                "shutting down: handing %d run(s) over to %s: %d at a turn boundary, %d cut "
                "mid-turn (those go on from their newest checkpoint)%s",
                len(run_ids),
                "the other processes" if self._ctx.bus.shared else "the next process to start",
                len(run_ids) - len(cut),
                len(cut),
                f": {', '.join(cut[:10])}{' …' if len(cut) > 10 else ''}" if cut else "",
            )
            await self._hand_over(run_ids)

    async def _hand_over(self, run_ids: list[str]) -> None:
        owner = self._ctx.instance_id
        try:
            await self._ctx.log.commit(
                action=lambda conn: LeaseRepository.release_owned_in(conn, owner, run_ids)
            )
        except StorageUnavailable:
            log.warning("could not release %d run lease(s) at shutdown", len(run_ids))
        # Suspended at a turn boundary, or cut with their leases released: another process
        # continues them at once rather than after the lease expiry or this one's restart.
        self._ctx.bus.tell({"kind": "handover", "run_ids": run_ids})
